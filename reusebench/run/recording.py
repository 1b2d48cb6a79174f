"""The recording core every driver shares: the run directory, the record header, Completion -> Record, the LoRA
key, a task's cause from the log, the prefill budget and the scrubbed log.

A driver (the scenario session: one conversation at a time; a workload's run: many users, serial or
free-running; the tap: real clients, passively) differs only in how its requests arise. What it writes goes
through one ``Recorder``, so a record means the same whichever driver wrote it.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reusebench.budget import PrefillBudget, add_prefilled, new_prefill_sums
from reusebench.capability import Capabilities
from reusebench.config.profiles import Variant
from reusebench.llama import logs
from reusebench.llama.client import Completion
from reusebench.llama.task_log import Task
from reusebench.records import Extra, Lora, Record, RecordWriter, Role, lora_key, tokens_hash, verdict

UNKNOWN_BUILD = "unknown"


def new_run_id() -> str:
    """Local time to the second plus a random suffix, so two runs started in the same second differ."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class RunDir:
    """One run's directory under ``results/runs``: its records, its kept logs, its provenance."""

    run_id: str
    path: Path

    @classmethod
    def create(cls, results_dir: Path) -> RunDir:
        run_id = new_run_id()
        path = Path(results_dir) / "runs" / run_id
        path.mkdir(parents=True, exist_ok=False)
        return cls(run_id, path)

    @property
    def records_path(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def log_dir(self) -> Path:
        return self.path / "logs"


@dataclass(frozen=True)
class Source:
    """What every record names as where it came from: a profile's variant and its model, or the tap's server."""

    profile: str
    variant: str
    model: str

    @classmethod
    def of(cls, variant: Variant) -> Source:
        return cls(variant.profile, variant.name, variant.model_spec)


class Recorder:
    """Writes one driver's records: the header every record carries, the figures of a Completion, the summary
    record, the tally of prefilled tokens by role, and the scrubbed server log. Thread-safe."""

    def __init__(self, writer: RecordWriter, source: Source, *, run: RunDir, session: str, size: int,
                 extra: Extra | None = None, hash_tokens: Callable[[Sequence[int]], str] = tokens_hash,
                 shared: int = 0, speculative: bool = False) -> None:
        self.writer, self.source, self.session, self.size = writer, source, session, size
        # a speculating launch's answer that drafted nothing records 0 drafted: b11434's timings leave draft_n out then
        self.speculative = speculative
        self.shared = shared  # tokens every conversation starts with (a workload's system prompt): ``verdict``'s
        self.run_id, self.log_dir = run.run_id, run.log_dir
        self.hash_tokens = hash_tokens  # prompt and output hashes: the tap keys them (tap.keys)
        self.extra = extra or Extra()  # on every record (a repeated session's number)
        self.build = UNKNOWN_BUILD
        self._prefilled = new_prefill_sums()  # the budget's sums, not the records: a tap runs for months
        self._written = 0
        self._lock = threading.Lock()

    def learn_build(self, label: str, capabilities: Capabilities | None = None) -> str:
        """The build label records carry (``binaries.build_label``, or the server's /props), with the rules its
        probes showed where they differ from the pinned build's (``Capabilities.label``)."""
        self.build = label
        if capabilities is not None:
            self.build += f"; {capabilities.label()}"
        return self.build

    def record(self, scenario: str, step: str, role: Role, endpoint: str, started: float, **fields: Any) -> Record:
        """A record with the header filled in; `fields` set the rest (user, turn, slot, ...)."""
        s = self.source
        return Record(run_id=self.run_id, session=self.session, profile=s.profile, variant=s.variant, build=self.build,
                      model=s.model, size=self.size, scenario=scenario, step=step, role=role, endpoint=endpoint,
                      started_at=started, ended_at=fields.pop("ended_at", time.time()), extra=self.extra.copy(),
                      **fields)

    def open(self, scenario: str, step: str, role: Role, endpoint: str, *, tokens: Sequence[int] | None,
             lora: Lora = None, ideal: int | None = None, started: float | None = None, **fields: Any) -> Record:
        """A call's record as it is sent (or, for the tap, as it was): the header (``record``) and its request
        (``request``; none when the driver could not read the prompt). Every call of every driver goes open -> sent
        -> ``answered`` or ``cut_short`` -> ``write``."""
        record = self.record(scenario, step, role, endpoint, time.time() if started is None else started, **fields)
        if tokens is not None:
            self.request(record, tokens, lora, ideal)
        return record

    def answered(self, record: Record, c: Completion, claim: Callable[[Record], Task | None], *,
                 judged: bool = True) -> Task | None:
        """A call's answer: its figures (``fill``), then its task in the server's log (`claim`: ``TaskLog.claim``,
        the one way a call is matched to the log) and what the log says of it (``attach_task``), and, for a
        measured call the driver can judge, its verdict (``records.verdict``). Returns the task, None when the log
        never showed it."""
        self.fill(record, c)
        task = claim(record)
        if task is not None:
            self.attach_task(record, task)
        if judged and record.role == Role.MEASURE:
            record.verdict = verdict(record, self.shared)
        return task

    def cut_short(self, record: Record, error: str, status: int | None = None) -> None:
        """A call that failed or was interrupted (``records.interrupted``): when and why, written at once."""
        record.ended_at, record.status, record.error = time.time(), status, error
        self.write(record)

    def request(self, record: Record, tokens: Sequence[int], lora: Lora, ideal: int | None) -> None:
        """What a record says about the request it sends: the LoRA key, the prompt's length and hash, the ideal."""
        record.lora, record.prompt_tokens, record.prompt_hash = lora_key(lora), len(tokens), self.hash_tokens(tokens)
        record.ideal = ideal

    def fill(self, record: Record, c: Completion) -> None:
        """The answer's figures: counts, timings, the slot, the output's hash, and the excess over the ideal."""
        record.ended_at = time.time()
        record.slot = c.id_slot
        record.prompt_n, record.cache_n, record.prompt_ms = c.prompt_n, c.cache_n, c.prompt_ms
        record.prefilled_n = c.prompt_n
        record.predicted_n, record.predicted_ms = c.predicted_n, c.predicted_ms
        record.ttft_ms, record.wall_ms = c.ttft_ms, c.wall_ms
        record.output_hash = self.hash_tokens(c.tokens)
        record.excess = None if record.ideal is None else c.prompt_n - record.ideal
        if c.draft_n is not None or self.speculative:
            record.extra.update(Extra(draft_n=c.draft_n or 0, draft_accepted=c.draft_accepted or 0))

    @staticmethod
    def attach_task(record: Record, task: Task) -> None:
        """What the server's log says of the record's task: its cause, and what its launch moved in the RAM cache."""
        record.cause = task.cause().to_dict()
        record.extra.update(Extra(task=task.task, displaced=task.displaced, idle_saved=task.idle_saved,
                                  evicted_mib=task.evicted_mib,
                                  checkpoints_erased_old=sum(e.kind == "checkpoint_erased_old" for e in task.events)))

    def write(self, record: Record) -> None:
        with self._lock:
            self.writer.write(record)
            add_prefilled(self._prefilled, record)
            self._written += 1

    def budget(self) -> PrefillBudget:
        """Prompt tokens prefilled by role over every record written so far (``records.add_prefilled``)."""
        with self._lock:
            if not self._written:
                return PrefillBudget(self.session, 0, 0, 0, 0, self.size)
            return PrefillBudget.of(self.session, dict(self._prefilled), self.size)

    def summary(self, scenario: str, started_at: float, wall_s: float, extra: Extra,
                **fields: Any) -> Record:
        """The session's record that is no HTTP call (role "session"): written, and returned."""
        record = self.record(scenario, "summary", Role.SESSION, "", started_at, status=None, wall_ms=wall_s * 1000.0,
                             **fields)
        record.extra |= extra
        self.write(record)
        return record

    def keep_log(self, raw: Path, name: str) -> None:
        """Append the scrubbed server log (numbers-only lines, ``logs.scrub_line``) to ``log_dir/name.log``."""
        if not raw.exists():
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(raw, errors="replace") as src, open(self.log_dir / f"{name}.log", "a") as dst:
            dst.writelines(f"{kept}\n" for line in src if (kept := logs.scrub_line(line.rstrip("\n"))))
