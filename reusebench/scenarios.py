"""The scenario catalogue: what is sent, in which order, and what is measured.

Each scenario is a function over a ``Steps`` object (the session implements it)
and reads like the experiment it is. Setup requests prepare a precondition and
are labelled as such; measured requests are the figures. What a perfect cache
would re-process is not written here: the session derives it for every request
from everything the server has already seen under the same LoRA setting.

The order in ``CATALOGUE`` is chosen to pay as few extra full prefills as
possible: each scenario leaves the slot in the state the next one starts from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from reusebench.client import Completion

Prompt = str | Sequence[int]


class Steps(Protocol):
    """What a scenario can do; implemented by ``session.Session``."""

    document: str
    other: str
    edited: str
    questions: tuple[str, str]
    summary: str

    def prompt(self, document: str, question: str) -> str: ...

    def measure(self, scenario: str, step: str, prompt: Prompt, *, expect_hit: bool = True,
                lora: list[dict[str, float]] | None = None) -> Completion: ...

    def setup(self, scenario: str, step: str, prompt: Prompt, *,
              lora: list[dict[str, float]] | None = None) -> Completion: ...

    def save_slot(self, scenario: str, filename: str) -> None: ...

    def restart(self, scenario: str) -> None: ...

    def restore_slot(self, scenario: str, filename: str) -> None: ...

    def tokens(self, text: str, *, bos: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    run: Callable[[Steps], None]
    requires: tuple[str, ...] = ()  # llama-server options the scenario needs in the profile


SAVED_SLOT = "reusebench-first.bin"


def first_load(s: Steps) -> None:
    """Cold prefill of D + Q1 on a fresh server: the baseline everything is compared with."""
    s.measure("first_load", "cold", s.prompt(s.document, s.questions[0]), expect_hit=False)


def resend(s: Steps) -> None:
    """The identical prompt again: a perfect cache re-processes one token."""
    s.measure("resend", "same prompt", s.prompt(s.document, s.questions[0]))


def interleave(s: Steps) -> None:
    """Another document in between, then back to the first (report A's E4)."""
    s.setup("interleave", "other document", s.prompt(s.other, s.questions[0]))
    s.measure("interleave", "back to first", s.prompt(s.document, s.questions[0]))
    # The slot now holds D + Q1 again: keep it on disk for restore_disk.
    s.save_slot("interleave", SAVED_SLOT)


def reask(s: Steps) -> None:
    """Same document, a question that differs from its first token on (report A's E2)."""
    s.measure("reask", "new question", s.prompt(s.document, s.questions[1]))


def edit_middle(s: Steps) -> None:
    """One line inserted at 50% of the document (report A's E3)."""
    s.measure("edit_middle", "line at 50%", s.prompt(s.edited, s.questions[0]))


def restore_disk(s: Steps) -> None:
    """Save slot, restart the server, restore it, then resend, re-ask and strictly extend (E5)."""
    first = s.prompt(s.document, s.questions[0])
    s.restart("restore_disk")
    s.restore_slot("restore_disk", SAVED_SLOT)
    resent = s.measure("restore_disk", "resend", first)
    s.restore_slot("restore_disk", SAVED_SLOT)
    s.measure("restore_disk", "reask", s.prompt(s.document, s.questions[1]))
    # Only a prompt that extends the saved tokens, generated ones included, can use a
    # restored hybrid state (reference/llama-server.md 3.4).
    s.restore_slot("restore_disk", SAVED_SLOT)
    extension = [*s.tokens(first), *resent.tokens, *s.tokens(s.questions[1], bos=False)]
    s.measure("restore_disk", "extension", extension)


CATALOGUE: tuple[Scenario, ...] = (
    Scenario("first_load", "cold prefill", first_load),
    Scenario("resend", "identical prompt", resend),
    Scenario("interleave", "other document, then back", interleave),
    Scenario("reask", "new question", reask),
    Scenario("edit_middle", "one line inserted at 50%", edit_middle),
    Scenario("restore_disk", "save slot, restart, restore", restore_disk),
)

SCENARIO_IDS: tuple[str, ...] = tuple(sc.id for sc in CATALOGUE)


def select(ids: Sequence[str] | None) -> list[Scenario]:
    """The scenarios to run, in catalogue order; ``first_load`` always comes first."""
    if not ids:
        return list(CATALOGUE)
    unknown = sorted(set(ids) - set(SCENARIO_IDS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIO_IDS)}")
    wanted = {"first_load", *ids}
    return [sc for sc in CATALOGUE if sc.id in wanted]
