"""The scenario catalogue: what is sent, in which order, and what is measured.

Each scenario is a function over a ``Steps`` object (the session implements it)
and reads like the experiment it is. Setup requests prepare a precondition and
are labelled as such; measured requests are the figures. What a perfect cache
would re-process is not written here: the session derives it for every request
from everything the server has already seen under the same LoRA setting. A
measured turn that no cache could serve (a conversation's first turn, a head
insert, a turn after the server slept) says so with ``expect_hit=False``, so
rates count it apart from turns that should hit (report B).

Each scenario declares the steps it measures (``Scenario.measures``): the asv
suite takes its step parameters from these declarations before anything runs,
and a test runs every scenario against a recorder to check that each measures
exactly what it declares.

The order in ``CATALOGUE`` is chosen to pay as few extra full prefills as
possible: each scenario leaves the slot in the state the next one starts from,
and the only setup prefills are the ones a scenario is about (another document
in between, a conversation computed with a LoRA). A scenario whose precondition
another one leaves sets it up itself when that one is not selected
(``Precondition``), so any selection runs.

How llama-server reuses prompts, and why a hybrid can only return to its
checkpoints, is written down in docs/llama-server-reuse.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from reusebench.capability import Capabilities
from reusebench.llama.client import Completion
from reusebench.llama.facts import NO_LORA

Prompt = str | Sequence[int]
Lora = list[dict[str, float]]
Messages = list[dict[str, str]]

SAVED_SLOT = "reusebench-first.bin"
LORA = [{"id": 0, "scale": 0.5}]  # report B's regression test
PROBE_TOKENS = 21  # report B's health check
# Enough removed text that a stale recurrent state visibly changes the output (one line is within tolerance).
CHUNK_AT, CHUNK_LENGTH = 0.1, 0.1
# Step names key the asv history (scenario/step): the catalogue declares them as literals, so that changing a
# constant above cannot silently rename one; tests/test_scenarios.py pins every scenario to its declaration.
CHUNK_STEP = "10% cut at 10%"
GROWTH_STEPS = ("turn 1", "turn 2", "turn 3", "turn 4")  # one measured step per turn of the chat


class Steps(Protocol):
    """What a scenario can do; implemented by ``session.Session``."""

    # read-only: the session's documents and what its server was started with
    @property
    def document(self) -> str: ...

    @property
    def other(self) -> str: ...

    @property
    def edited(self) -> str: ...

    @property
    def questions(self) -> tuple[str, str]: ...

    @property
    def summary(self) -> str: ...

    @property
    def lora_adapters(self) -> int: ...  # adapters the server was started with

    @property
    def multimodal(self) -> bool: ...  # an mmproj is loaded

    @property
    def images(self) -> bool: ...  # the documents carry images (the corpus's ``images:``)

    @property
    def slot_actions(self) -> bool: ...  # the server takes slot saves, restores and erases

    @property
    def capabilities(self) -> Capabilities: ...  # the build's, where builds differ

    @property
    def n_slots(self) -> int: ...  # the server's slots (parallel, auto resolved)

    @property
    def ram_cache(self) -> bool: ...  # a RAM prompt cache (cache-ram not 0)

    @property
    def sleep_idle_s(self) -> float | None: ...  # sleep-idle-seconds; None when unset

    def prompt(self, document: str, question: str) -> str: ...

    def measure(self, scenario: str, step: str, prompt: Prompt, *, expect_hit: bool = True,
                lora: Lora | None = None, may_stop: bool = False) -> None: ...

    def setup(self, scenario: str, step: str, prompt: Prompt, *, lora: Lora | None = None) -> Completion: ...

    def chat(self, scenario: str, step: str, messages: Messages, *, expect_hit: bool = True) -> str: ...

    def save_slot(self, scenario: str, filename: str) -> None: ...

    def restart(self, scenario: str) -> None: ...

    def restore_slot(self, scenario: str, filename: str) -> None: ...

    def wait_until_asleep(self, scenario: str) -> None: ...

    def tokens(self, text: str, *, bos: bool = True) -> list[int]: ...
    def saved_tokens(self, filename: str) -> list[int]: ...


@dataclass(frozen=True)
class Precondition:
    """A state a scenario needs, which another one leaves when it runs before (the catalogue's order)."""

    left_by: str  # that scenario's id
    set_up: Callable[[Steps], None]  # sets the state up when that scenario is not selected


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    run: Callable[[Steps], None]
    measures: tuple[str, ...]  # the steps it measures, in order: asv parameters as "id/step"
    # Why the scenario cannot run on this variant, or None when it can.
    not_applicable: Callable[[Steps], str | None] = lambda s: None
    precondition: Precondition | None = None


def next_turn(s: Steps, prompt: str, answer: Completion, question: str) -> list[int]:
    """A conversation continuing: the previous prompt, the answer the server generated, a new question."""
    return [*s.tokens(prompt), *answer.tokens, *s.tokens(question, bos=False)]


def remove_lines(document: str, start: float, length: float) -> str:
    """The document without the whole lines from ``start`` to ``start + length`` (fractions of its length)."""
    begin, end = int(len(document) * start), int(len(document) * (start + length))
    line_begin, line_end = document.rfind("\n", 0, begin), document.find("\n", end)
    return document[: line_begin if line_begin >= 0 else begin] + document[line_end if line_end >= 0 else end :]


# -- preconditions ----------------------------------------------------------------------------


def needs_sleep(s: Steps) -> str | None:
    seconds = s.sleep_idle_s
    if (seconds or 0) > 0:
        return None
    return f"needs sleep-idle-seconds > 0 (this variant: {'unset' if seconds is None else f'{seconds:g}'})"


def needs_slot_files(s: Steps) -> str | None:
    if not s.slot_actions:
        return "this build refuses slot files while an mmproj is loaded (reusebench probe)"
    return None


def needs_text_ids(s: Steps) -> str | None:
    """A scenario that sends a prompt of token ids (a generated answer in it) cannot send the document's images."""
    if s.images:
        return ("sends a prompt built from token ids, and /completion takes images only with a prompt string "
                "(the corpus's documents carry images)")
    return None


def needs_lora_one_slot_ram_cache(s: Steps) -> str | None:
    if needs_text_ids(s):
        return needs_text_ids(s)
    missing = [what for ok, what in (
        (s.lora_adapters > 0, "a LoRA adapter (`lora:`)"),
        (s.n_slots == 1, "one slot (`parallel: 1`)"),
        (s.ram_cache, "a RAM prompt cache (`cache-ram` not 0)"),
    ) if not ok]
    return f"needs {', '.join(missing)}" if missing else None


# -- the scenarios ----------------------------------------------------------------------------


def first_load(s: Steps) -> None:
    """Cold prefill of D + Q1 on a fresh server: the baseline everything is compared with."""
    s.measure("first_load", "cold", s.prompt(s.document, s.questions[0]), expect_hit=False)


def after_sleep(s: Steps) -> None:
    """Idle past --sleep-idle-seconds, then D + Q1 again: a sleeping server frees its slots and RAM cache.

    D + Q1's tokens are known from first_load, so nothing wakes the server before the measured request.
    """
    s.wait_until_asleep("after_sleep")
    s.measure("after_sleep", "same prompt after sleeping", s.prompt(s.document, s.questions[0]), expect_hit=False)


def resend(s: Steps) -> None:
    """The identical prompt again: a perfect cache re-processes one token."""
    s.measure("resend", "same prompt", s.prompt(s.document, s.questions[0]))


def chunk_removed(s: Steps) -> None:
    """A chunk near the start of D removed, then resent. With --cache-reuse a hybrid shifts the attention cache
    but restores a checkpoint whose recurrent state still holds the removed text: reuse with the wrong state."""
    cut = remove_lines(s.document, CHUNK_AT, CHUNK_LENGTH)
    s.measure("chunk_removed", CHUNK_STEP, s.prompt(cut, s.questions[0]))


def interleave(s: Steps) -> None:
    """Another document in between, then back to the first (report A's interleave-and-return step)."""
    s.setup("interleave", "other document", s.prompt(s.other, s.questions[0]))
    s.measure("interleave", "back to first", s.prompt(s.document, s.questions[0]))
    # The slot now holds D + Q1 again: keep it on disk for restore_disk, where the build can.
    if needs_slot_files(s) is None:
        s.save_slot("interleave", SAVED_SLOT)


def reask(s: Steps) -> None:
    """Same document, a question that differs from its first token on (report A's re-ask)."""
    s.measure("reask", "new question", s.prompt(s.document, s.questions[1]))


def probe_eviction(s: Steps) -> None:
    """Report B's side finding: a 21-token health check between two turns of a big conversation. It shares
    the conversation's opening (as a health check shares the chat template's), so it takes the big slot.

    The conversation is D + Q2, what reask leaves in the slot; it runs after reask because the next turn's
    checkpoints would otherwise serve reask from closer than report A's 4 + n_ubatch tokens.
    """
    first = s.prompt(s.document, s.questions[1])
    answer = s.setup("probe_eviction", "conversation turn", first)
    s.setup("probe_eviction", f"{PROBE_TOKENS}-token probe", s.tokens(s.document)[:PROBE_TOKENS])
    s.measure("probe_eviction", "next turn", next_turn(s, first, answer, s.questions[0]))


def edit_middle(s: Steps) -> None:
    """One line inserted at 50% of the document (report A's mid-document edit). No later scenario starts from
    the state it leaves (head_insert and growth share nothing with it, restore_disk restarts), so it may stop
    once its count is known."""
    s.measure("edit_middle", "line at 50%", s.prompt(s.edited, s.questions[0]), may_stop=True)


def head_insert(s: Steps) -> None:
    """A summary inserted at the head (report B's structural miss): every token after it changes. What follows
    shares nothing with it (a new chat, a restart, a LoRA setup), so it may stop once its count is known."""
    s.measure("head_insert", "summary at the head", s.prompt(f"{s.summary}\n{s.document}", s.questions[0]),
              expect_hit=False, may_stop=True)


def growth(s: Steps) -> None:
    """A chat that only appends, through /v1/chat/completions: turn k+1 = turn k + the answer + a question."""
    messages = [{"role": "user", "content": s.prompt(s.document, s.questions[0])}]
    reply = s.chat("growth", GROWTH_STEPS[0], messages, expect_hit=False)  # a conversation's first turn
    for turn, step in enumerate(GROWTH_STEPS[1:], start=2):
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": s.questions[turn % 2]}]
        reply = s.chat("growth", step, messages)


def save_first_prompt(s: Steps) -> None:
    """restore_disk's precondition without interleave: D + Q1 in the slot (a resend: only the tokens after the
    last checkpoint when it is already there), saved to SAVED_SLOT."""
    s.setup("restore_disk", "document + first question", s.prompt(s.document, s.questions[0]))
    s.save_slot("restore_disk", SAVED_SLOT)


def restore_disk(s: Steps) -> None:
    """Restart the server, restore the slot saved with D + Q1, then resend, re-ask and strictly extend (not with
    images: the extension is token ids). Each
    step restores the file first, so the resend and the re-ask may stop once their counts are known (the re-ask's
    reference was computed before the restart)."""
    s.restart("restore_disk")
    s.restore_slot("restore_disk", SAVED_SLOT)
    s.measure("restore_disk", "resend", s.prompt(s.document, s.questions[0]), may_stop=True)
    s.restore_slot("restore_disk", SAVED_SLOT)
    s.measure("restore_disk", "reask", s.prompt(s.document, s.questions[1]), may_stop=True)
    if s.images:  # the extension is token ids (the saved answer's), which /completion takes with no image
        return
    # A restored slot carries no checkpoints, so a hybrid can use it only for a prompt that extends the saved
    # tokens, generated ones included (docs/llama-server-reuse.md).
    s.restore_slot("restore_disk", SAVED_SLOT)
    s.measure("restore_disk", "extension", [*s.saved_tokens(SAVED_SLOT), *s.tokens(s.questions[1], bos=False)])


def lora_swap(s: Steps) -> None:
    """Report B's regression (1 slot, RAM cache), then the wrong output it hides: RAM cache entries do not
    record the LoRA they were computed with (docs/llama-server-reuse.md).

    Last in the catalogue: it leaves a LoRA-computed state in the slot under a request without LoRA.
    """
    conversation = s.prompt(s.document, s.questions[0])
    other_user = s.questions[1]  # shares only BOS with the conversation, so it takes the only slot by LRU
    answer = s.setup("lora_swap", "P with LoRA", conversation, lora=LORA)
    s.setup("lora_swap", "Q without LoRA", other_user, lora=NO_LORA)  # P goes to the RAM cache
    more = next_turn(s, conversation, answer, s.questions[1])
    # restored from RAM, then cleared because the slot's LoRA is Q's: report B's cache_n 0
    s.measure("lora_swap", "P + more, same LoRA", more, lora=LORA)
    s.setup("lora_swap", "Q without LoRA again", other_user, lora=NO_LORA)
    # RAM entries carry no LoRA: the LoRA-computed state serves a request without LoRA. A LoRA-aware
    # cache has never computed P without LoRA, so this turn cannot (rightly) hit.
    s.measure("lora_swap", "P + more, no LoRA", more, lora=NO_LORA, expect_hit=False)


FIRST_LOAD = Scenario("first_load", "cold prefill", first_load, ("cold",))  # every selection starts with it
CATALOGUE: tuple[Scenario, ...] = (
    FIRST_LOAD,
    Scenario("after_sleep", "idle past sleep-idle-seconds", after_sleep, ("same prompt after sleeping",),
             needs_sleep),
    Scenario("resend", "identical prompt", resend, ("same prompt",)),
    Scenario("chunk_removed", "a chunk near the start removed", chunk_removed, (CHUNK_STEP,)),
    Scenario("interleave", "other document, then back", interleave, ("back to first",)),
    Scenario("reask", "new question", reask, ("new question",)),
    Scenario("probe_eviction", "a tiny request between two turns", probe_eviction, ("next turn",), needs_text_ids),
    Scenario("edit_middle", "one line inserted at 50%", edit_middle, ("line at 50%",)),
    Scenario("head_insert", "summary inserted at the head", head_insert, ("summary at the head",)),
    Scenario("growth", "chat that only appends", growth, GROWTH_STEPS),
    Scenario("restore_disk", "save slot, restart, restore", restore_disk, ("resend", "reask", "extension"),
             needs_slot_files, precondition=Precondition("interleave", save_first_prompt)),
    Scenario("lora_swap", "LoRA swap through the RAM cache", lora_swap,
             ("P + more, same LoRA", "P + more, no LoRA"), needs_lora_one_slot_ram_cache),
)

SCENARIO_IDS: tuple[str, ...] = tuple(sc.id for sc in CATALOGUE)
# Every measured step as "scenario/step", in catalogue order: the asv suite's step parameters.
MEASURED_STEPS: tuple[str, ...] = tuple(f"{sc.id}/{step}" for sc in CATALOGUE for step in sc.measures)


def select(ids: Sequence[str] | None) -> list[Scenario]:
    """The scenarios to run, in catalogue order; ``first_load`` always comes first. A scenario whose
    precondition is left by one that is not selected sets it up itself."""
    if not ids:
        return list(CATALOGUE)
    unknown = sorted(set(ids) - set(SCENARIO_IDS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIO_IDS)}")
    wanted = {"first_load", *ids}
    return [sc if sc.precondition is None or sc.precondition.left_by in wanted else standalone(sc, sc.precondition)
            for sc in CATALOGUE if sc.id in wanted]


def standalone(scenario: Scenario, precondition: Precondition) -> Scenario:
    """`scenario` setting up its own precondition before it runs."""
    set_up, run = precondition.set_up, scenario.run

    def prepared(s: Steps) -> None:
        set_up(s)
        run(s)

    return replace(scenario, run=prepared, precondition=None)
