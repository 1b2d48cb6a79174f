"""Declarative service workloads (``workloads/*.yaml``): load and validate strictly.

A workload says who talks to one server and how: groups of users with their
conversation sizes, turns, think time and LoRA share; when users arrive; history
summaries inserted at the head every N turns; regenerations (the same turn sent
again); a health check of a few tokens every few seconds; idle gaps, each after a
given turn of every conversation, that last until the server sleeps; bounds in
requests and seconds; a seed, so the same file gives the same conversations; and the schedule: serial (one
request at a time, in an order fixed by the file) or free-running (one thread per user). Every error names the
file and the field, as profiles do (reusebench/config/profiles.py); token counts are read by
reusebench.config.sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reusebench import reader
from reusebench.config import sizes
from reusebench.reader import Document

WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "workloads"
# during_prefill: each user after the first arrives as the server starts the first prompt of the one before it,
# an event of the server rather than a time, so requests that run through a long prefill are arranged on any CPU.
DURING_PREFILL = "during_prefill"
ARRIVALS = ("together", "staggered", "poisson", DURING_PREFILL)
TIMED_ARRIVALS = ("staggered", "poisson")
# serial: one request at a time in an order fixed by the file, so a build's counts repeat exactly;
# free-running: one thread per user on the wall clock, whose counts vary (reusebench.run.service)
SERIAL, FREE_RUNNING = "serial", "free-running"
SCHEDULES = (SERIAL, FREE_RUNNING)
TAPPED = "tap"  # what a tap's summary names as its schedule: real clients, in whatever order they came


class WorkloadError(ValueError):
    """An invalid workload; the message starts with "<file>: <field>:"."""


@dataclass(frozen=True)
class Lora:
    """Which users carry an adapter: `share` of the group, adapter `adapter` at `scale`."""

    share: float
    adapter: int
    scale: float


@dataclass(frozen=True)
class UserGroup:
    name: str
    count: int
    opening_tokens: int  # the conversation's first prompt after the shared system prompt
    turns: int
    lora: Lora | None


@dataclass(frozen=True)
class HealthCheck:
    tokens: int  # the probe's prompt: the system prompt's opening, then its own tokens
    period_s: float


@dataclass(frozen=True)
class Workload:
    name: str
    path: Path
    description: str
    profile: str
    variant: str | None
    seed: int
    groups: tuple[UserGroup, ...]
    system_prompt_tokens: int  # shared by every conversation and the health check (a chat template's opening)
    question_tokens: int  # what a user adds per turn
    n_predict: int
    think_time_s: tuple[float, float]  # uniform between the two
    arrival: str
    arrival_gap_s: float  # staggered: the gap; poisson: the mean gap
    head_insert_every: int | None  # turns; None: never
    summary_tokens: int
    regenerate_share: float  # of the turns after the first
    health_check: HealthCheck | None
    # Each gap comes once every user with more turns has finished this turn, and lasts until the server sleeps:
    # a turn, not a time, so the same turns come after the sleep however fast the machine is.
    idle_gaps_after_turn: tuple[int, ...]
    long_prefill_tokens: int  # a prefill at least this long is "long" for interference
    max_requests: int
    max_seconds: float  # free-running only: the serial schedule's length is fixed by the file
    schedule: str  # SERIAL or FREE_RUNNING

    @property
    def users(self) -> int:
        return sum(group.count for group in self.groups)


def workload_names(directory: Path = WORKLOADS_DIR) -> list[str]:
    return sorted(path.stem for path in directory.glob("*.yaml"))


def load_workload(name_or_path: str | Path, directory: Path = WORKLOADS_DIR) -> Workload:
    """Read and check a workload given by name (in `directory`) or by path."""
    path = reader.find(name_or_path, directory, WorkloadError, "workload")
    return _Reader(reader.read(path, WorkloadError, "workload")).workload()


class _Reader:
    """Takes the fields out of one file, each checked where it is read, so the error names it."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.path = document.path
        self.raw = document.data

    def fail(self, where: str, why: str) -> WorkloadError:
        return WorkloadError(f"{self.document.at(where)}: {where}: {why}")

    def known(self, table: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in fields:
                hint = reader.did_you_mean(str(key), fields)
                raise self.fail(f"{where}{key}", f"unknown field{hint}; valid fields: {', '.join(fields)}")

    def value(self, table: dict[str, Any], key: str, where: str, kind: Callable[[Any, str], Any], default: Any = None,
              required: bool = False) -> Any:
        if key not in table:
            if required:
                raise self.fail(f"{where}{key}", "required")
            return default
        return kind(table[key], f"{where}{key}")

    # value kinds

    def tokens(self, value: Any, where: str) -> int:
        try:
            return sizes.parse_size(value)
        except sizes.SizeError as error:
            raise self.fail(where, str(error)) from None

    def count(self, value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.fail(where, f"expected a whole number of at least 1, got {value!r}")
        return value

    def seconds(self, value: Any, where: str) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise self.fail(where, f"expected seconds (a number, 0 or more), got {value!r}")
        return float(value)

    def share(self, value: Any, where: str) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
            raise self.fail(where, f"expected a share from 0 to 1, got {value!r}")
        return float(value)

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"expected a string, got {value!r}")
        return reader.expand_env(value, source=self.document.at(where), field_name=where, error=WorkloadError)

    def table(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {value!r}")
        return value

    # the workload

    FIELDS = ("description", "profile", "variant", "seed", "users", "system_prompt_tokens", "question_tokens",
              "n_predict", "think_time_s", "arrival", "head_insert", "regenerate_share", "health_check",
              "idle_gaps_after_turn", "long_prefill_tokens", "max_requests", "max_seconds", "schedule")

    def workload(self) -> Workload:
        raw = self.raw
        self.known(raw, self.FIELDS, "")
        seed = raw.get("seed")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise self.fail("seed", f"required: a whole number, so the same file gives the same run; got {seed!r}")
        groups = self.value(raw, "users", "", self.groups, required=True)
        head = self.value(raw, "head_insert", "", self.table, {})
        self.known(head, ("every_turns", "summary_tokens"), "head_insert.")
        health = self.value(raw, "health_check", "", self.health_check)
        arrival = self.arrival(raw.get("arrival", {"pattern": "together"}))
        schedule = self.value(raw, "schedule", "", self.schedule, SERIAL)
        gaps = self.value(raw, "idle_gaps_after_turn", "", self.gap_turns, ())
        longest = max(group.turns for group in groups)
        for index, after in enumerate(gaps):
            if after >= longest:
                raise self.fail(f"idle_gaps_after_turn[{index}]", f"no user has more than {after} turns, so nothing "
                                "would come after this gap")
        if arrival["arrival"] == DURING_PREFILL and schedule != FREE_RUNNING:
            raise self.fail("arrival.pattern", f"{DURING_PREFILL} sends a request while another runs, which the "
                            f"serial schedule never does; set schedule: {FREE_RUNNING}")
        return Workload(
            name=self.path.stem, path=self.path,
            description=self.value(raw, "description", "", self.text, ""),
            profile=self.value(raw, "profile", "", self.text, required=True),
            variant=self.value(raw, "variant", "", self.text),
            seed=seed, groups=groups,
            system_prompt_tokens=self.value(raw, "system_prompt_tokens", "", self.tokens, 24),
            question_tokens=self.value(raw, "question_tokens", "", self.tokens, 24),
            n_predict=self.value(raw, "n_predict", "", self.count, 32),
            think_time_s=self.value(raw, "think_time_s", "", self.think_time, (0.5, 2.0)),
            **arrival,
            head_insert_every=self.value(head, "every_turns", "head_insert.", self.count),
            summary_tokens=self.value(head, "summary_tokens", "head_insert.", self.tokens, 64),
            regenerate_share=self.value(raw, "regenerate_share", "", self.share, 0.0),
            health_check=health,
            idle_gaps_after_turn=gaps,
            long_prefill_tokens=self.value(raw, "long_prefill_tokens", "", self.tokens, 4096),
            max_requests=self.value(raw, "max_requests", "", self.count, required=True),
            max_seconds=self.value(raw, "max_seconds", "", self.seconds, required=True),
            schedule=schedule,
        )

    def groups(self, value: Any, where: str) -> tuple[UserGroup, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(where, f"expected a non-empty list of user groups, got {value!r}")
        groups = tuple(self.group(item, f"{where}[{index}]") for index, item in enumerate(value))
        names = [group.name for group in groups]
        if len(set(names)) != len(names):
            raise self.fail(where, f"names a group twice ({', '.join(names)})")
        return groups

    def group(self, value: Any, where: str) -> UserGroup:
        table = self.table(value, where)
        self.known(table, ("name", "count", "opening_tokens", "turns", "lora"), f"{where}.")
        prefix = f"{where}."
        return UserGroup(
            name=self.value(table, "name", prefix, self.text, required=True),
            count=self.value(table, "count", prefix, self.count, required=True),
            opening_tokens=self.value(table, "opening_tokens", prefix, self.tokens, required=True),
            turns=self.value(table, "turns", prefix, self.count, required=True),
            lora=self.value(table, "lora", prefix, self.lora),
        )

    def lora(self, value: Any, where: str) -> Lora:
        table = self.table(value, where)
        self.known(table, ("share", "adapter", "scale"), f"{where}.")
        adapter = table.get("adapter", 0)
        if not isinstance(adapter, int) or isinstance(adapter, bool) or adapter < 0:
            raise self.fail(f"{where}.adapter", f"expected an adapter index (0 or more), got {adapter!r}")
        scale = table.get("scale", 1.0)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
            raise self.fail(f"{where}.scale", f"expected a scale above 0, got {scale!r}")
        return Lora(self.value(table, "share", f"{where}.", self.share, required=True), adapter, float(scale))

    def think_time(self, value: Any, where: str) -> tuple[float, float]:
        if not isinstance(value, list) or len(value) != 2:
            raise self.fail(where, f"expected [shortest, longest] seconds, got {value!r}")
        low, high = (self.seconds(v, f"{where}[{i}]") for i, v in enumerate(value))
        if low > high:
            raise self.fail(where, f"the shortest ({low:g}) is longer than the longest ({high:g})")
        return low, high

    def arrival(self, value: Any) -> dict[str, Any]:
        table = self.table(value, "arrival")
        self.known(table, ("pattern", "gap_s"), "arrival.")
        pattern = table.get("pattern")
        if pattern not in ARRIVALS:
            raise self.fail("arrival.pattern", f"expected one of {', '.join(ARRIVALS)}, got {pattern!r}"
                            + reader.did_you_mean(str(pattern), ARRIVALS))
        gap = self.value(table, "gap_s", "arrival.", self.seconds, 0.0)
        if pattern in TIMED_ARRIVALS and gap <= 0:
            raise self.fail("arrival.gap_s", f"{pattern} arrivals need a gap above 0 seconds")
        return {"arrival": pattern, "arrival_gap_s": gap}

    def schedule(self, value: Any, where: str) -> str:
        if value not in SCHEDULES:
            raise self.fail(where, f"expected one of {', '.join(SCHEDULES)}, got {value!r}"
                            + reader.did_you_mean(str(value), SCHEDULES))
        return str(value)

    def health_check(self, value: Any, where: str) -> HealthCheck:
        table = self.table(value, where)
        self.known(table, ("tokens", "period_s"), f"{where}.")
        period = self.value(table, "period_s", f"{where}.", self.seconds, required=True)
        if period <= 0:
            raise self.fail(f"{where}.period_s", "must be above 0 seconds")
        tokens = self.value(table, "tokens", f"{where}.", self.tokens, required=True)
        if tokens <= 1:
            raise self.fail(f"{where}.tokens", "a probe needs at least 2 tokens (BOS and one more)")
        return HealthCheck(tokens, period)

    def gap_turns(self, value: Any, where: str) -> tuple[int, ...]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list of turn numbers, got {value!r}")
        turns = [self.count(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if turns != sorted(set(turns)):
            raise self.fail(where, "must be in increasing order")
        return tuple(turns)
