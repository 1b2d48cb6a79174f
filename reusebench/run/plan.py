"""What a run will cost, before it starts: each session's requests, and the prefills the reuse model expects.

``plan_session`` runs a session's scenarios against ``PlanSteps``, which sends nothing: its documents are
numbered words of the session's size (one token each), and the variant's reuse model (``reuse.expectation``)
stands in for the server. So it knows how many requests a session sends, how many tokens they carry, what
the model expects the server to prefill for each, which steps stop once their count is known
(``steps.stops_at``), and which no-reuse references verification adds at the end. ``Estimate`` turns the
plans into time left, from the prefill rate the latest first load measured.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from reusebench.config import corpus as corpus_mod
from reusebench.config import images, scenarios
from reusebench.config.sizes import size_label
from reusebench.llama.client import Completion
from reusebench.records import Lora, Record, Role, lora_key, tokens_hash
from reusebench.reuse import server_state
from reusebench.run.launch import LaunchSpec
from reusebench.run.variant_steps import VariantSteps

STOP_ABOVE_TOKENS = 8192  # a step that would re-process more than this may stop once its count is known
WORDS_PER_LINE = 12
ESTIMATE_EVERY_S = 10.0  # at most one "time left" line this often, besides the one after each first load


@dataclass(frozen=True)
class PlannedCall:
    scenario: str
    step: str
    role: Role
    prompt_tokens: int
    expected: int  # what the reuse model expects the server to re-process
    stops: bool = False  # the step stops once its count is known (``stops_at``)

    @property
    def prefill(self) -> int:
        """What the run will prefill for it: nothing for a step that stops at its count."""
        return 0 if self.stops else self.expected


@dataclass
class SessionPlan:
    name: str
    size: int
    calls: list[PlannedCall] = field(default_factory=list)

    @property
    def prefill(self) -> int:
        return sum(c.prefill for c in self.calls)

    def line(self) -> str:
        sent = sum(c.prompt_tokens for c in self.calls)
        stops = sum(c.stops for c in self.calls)
        references = sum(c.role == Role.REFERENCE for c in self.calls)
        return (f"{self.name}: {len(self.calls)} requests sending {sent:,} tokens; the reuse model expects "
                f"{self.prefill:,} prefilled ({self.prefill / self.size:.1f} documents of {size_label(self.size)}), "
                f"{stops} step(s) stopped at their count, {references} no-reuse reference(s)")


class PlanSteps(VariantSteps):
    """``scenarios.Steps`` without a server: words for tokens, the reuse model for the server."""

    def __init__(self, spec: LaunchSpec, corpus_spec: corpus_mod.CorpusSpec, size: int, plan: SessionPlan) -> None:
        self.spec, self.corpus_spec, self.plan = spec, corpus_spec, plan
        self.model = spec.reuse_model()
        self._ids: dict[str, int] = {}
        self._tokenized: dict[str, list[int]] = {}
        # documents of `size` tokens, as the session's are (``corpus.exact_document``); the question comes on top
        self.document = self._words("d", size)
        self.other = self._words("o", size)
        if corpus_spec.images is not None:  # each image a word here: its tokens are measured only by the session
            at = corpus_spec.images.at
            self.document, self.other = images.place(self.document, at, 0), images.place(self.other, at, len(at))
        lines = self.document.split("\n")
        middle = len(lines) // 2
        self.edited = "\n".join([*lines[:middle], corpus_spec.edit, *lines[middle:]])
        self.questions, self.summary = corpus_spec.questions, corpus_spec.summary
        self._saved: dict[str, tuple[server_state.Held, list[int]]] = {}
        self._slot: list[int] = []
        self._known: set[tuple[str, str]] = set()  # prompts computed without reuse
        self._waiting: dict[tuple[str, str], int] = {}  # reused prompts waiting for a reference -> their length
        self._answers = 0

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def _words(prefix: str, n: int) -> str:
        return "\n".join(" ".join(f"{prefix}{i}" for i in range(start, min(n, start + WORDS_PER_LINE)))
                         for start in range(0, n, WORDS_PER_LINE))

    # -- what scenarios read --------------------------------------------------------------------

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        if text not in self._tokenized:  # a session sends the same document in many prompts
            self._tokenized[text] = self._ids_of(text)
        return [0] * bos + self._tokenized[text]

    def _ids_of(self, text: str) -> list[int]:
        words = text.split()
        new = set(words).difference(self._ids)
        if new:  # new words get the next ids, in the order they first appear
            for word in dict.fromkeys(words):
                if word in new:
                    self._ids[word] = len(self._ids) + 1
        return list(map(self._ids.__getitem__, words))  # in C: a 128K prompt is 131,072 look-ups

    def saved_tokens(self, filename: str) -> list[int]:
        return list(self._saved[filename][1])

    # -- what scenarios do ----------------------------------------------------------------------

    def measure(self, scenario: str, step: str, prompt: scenarios.Prompt, *, expect_hit: bool = True,
                lora: Lora = None, may_stop: bool = False) -> None:
        self._complete(scenario, step, Role.MEASURE, self._prompt(prompt), lora, (), self.may_stop(may_stop))

    def setup(self, scenario: str, step: str, prompt: scenarios.Prompt, *, lora: Lora = None) -> Completion:
        return self._complete(scenario, step, Role.SETUP, self._prompt(prompt), lora, (), False)

    def chat(self, scenario: str, step: str, messages: scenarios.Messages, *, expect_hit: bool = True) -> str:
        tokens, user_starts = [0], []
        for message in messages:
            if message["role"] == "user":
                user_starts.append(len(tokens))
            tokens += self.tokens(f"<{message['role']}> {message['content']}", bos=False)
        answer = self._complete(scenario, step, Role.MEASURE, tokens, None, tuple(user_starts), False)
        return " ".join(f"a{t}" for t in answer.tokens)

    def save_slot(self, scenario: str, filename: str) -> None:
        self._saved[filename] = (self.model.saved(self.model.last_slot), list(self._slot))

    def restore_slot(self, scenario: str, filename: str) -> None:
        held, self._slot = self._saved[filename][0], list(self._saved[filename][1])
        self.model.restore(self.model.last_slot, held)

    def wait_until_asleep(self, scenario: str) -> None:
        self.references()
        self.model.sleep()

    def restart(self, scenario: str) -> None:
        self.references()
        self.model.restart()

    def references(self) -> None:
        """The no-reuse references nothing computed along the way: each a full prefill, before a restart or a sleep
        (which forget what they overwrite), else at the end."""
        for key, length in self._waiting.items():
            self.plan.calls.append(PlannedCall("", "reference", Role.REFERENCE, length, length))
            self._known.add(key)
        self._waiting.clear()

    # -- one call ---------------------------------------------------------------------------------

    def _prompt(self, prompt: scenarios.Prompt) -> list[int]:
        return self.tokens(prompt) if isinstance(prompt, str) else list(prompt)

    def _complete(self, scenario: str, step: str, role: Role, tokens: list[int], lora: Lora,
                  user_starts: tuple[int, ...], may_stop: bool) -> Completion:
        expected = self.model.complete(tokens, lora=lora, user_starts=user_starts)
        key = (tokens_hash(tokens), lora_key(lora) or "")
        verify = self.spec.verify
        stops = may_stop and stops_at(expected.prompt_n, expected.cache_n, verify=verify,
                                      awaited=verify and key in self._waiting)
        self.plan.calls.append(PlannedCall(scenario, step, role, len(tokens), expected.prompt_n, stops))
        n_predict = self.spec.variant.n_predict
        answer = [10**9 + self._answers + i for i in range(n_predict)]  # ids no prompt word has
        self._answers += n_predict
        if stops:
            self.model.erase(self.model.last_slot)
            self._slot = []
        else:
            self.model.answered(answer)
            self._slot = tokens + answer
        if not stops and expected.cache_n == 0:
            self._known.add(key)
            self._waiting.pop(key, None)
        elif not stops and role == Role.MEASURE and self.spec.verify and key not in self._known:
            self._waiting[key] = len(tokens)
        return Completion(prompt_n=expected.prompt_n, cache_n=expected.cache_n, prompt_ms=0.0,
                          predicted_n=len(answer), predicted_ms=0.0, tokens_evaluated=len(tokens), id_slot=0,
                          ttft_ms=None, wall_ms=0.0, tokens=answer)


def stops_at(prompt_n: int, cache_n: int, *, verify: bool, awaited: bool) -> bool:
    """Whether a step the scenario lets stop does stop, at its first progress event (``steps``): it would prefill
    more than ``STOP_ABOVE_TOKENS``, its output is not checked against a reference (it reused nothing, or nothing
    is verified), and it is not the reference a waiting step needs."""
    return prompt_n > STOP_ABOVE_TOKENS and not (cache_n > 0 and verify) and not (cache_n == 0 and awaited)



def plan_session(spec: LaunchSpec, size: int, selected: Sequence[scenarios.Scenario],
                 corpus_spec: corpus_mod.CorpusSpec, *, name: str) -> SessionPlan:
    """The calls a session of `spec` will make and what the reuse model expects each to prefill."""
    plan = SessionPlan(name, size)
    steps = PlanSteps(spec, corpus_spec, size, plan)
    for scenario in selected:
        if not scenario.not_applicable(steps):
            scenario.run(steps)
    if spec.verify:
        steps.references()
    return plan


def render_plan(plans: Sequence[SessionPlan]) -> str:
    total = sum(p.prefill for p in plans)
    head = (f"plan: {len(plans)} session(s), {sum(len(p.calls) for p in plans)} requests; the reuse model expects "
            f"{total:,} tokens prefilled in all")
    return "\n".join([head, *(f"  {p.line()}" for p in plans)])


class Estimate:
    """Time left in a run: the planned prefill tokens not yet done, at the latest first load's prefill rate."""

    def __init__(self, plans: Sequence[SessionPlan], out: TextIO) -> None:
        self.left = {p.name: list(p.calls) for p in plans}
        self.out = out
        self.rate: float | None = None  # tokens per second
        self._said = 0.0

    def done(self, session: str, record: Record) -> None:
        """A call ended: its planned call is done; a first load sets the rate and says the estimate, as do later
        calls at most every ``ESTIMATE_EVERY_S``."""
        left = self.left.get(session, [])
        planned = next((c for c in left if c.role == record.role and (
            c.role == Role.REFERENCE or (c.scenario, c.step) == (record.scenario, record.step))), None)
        if planned is not None:
            left.remove(planned)
        first_load = record.scenario == "first_load" and record.role == Role.MEASURE
        if first_load and record.prompt_ms and record.prompt_n:
            self.rate = record.prompt_n / (record.prompt_ms / 1000.0)
        if self.rate and (first_load or time.monotonic() - self._said >= ESTIMATE_EVERY_S):
            self._said = time.monotonic()
            tokens = sum(c.prefill for calls in self.left.values() for c in calls)
            said = (f"{_duration(tokens / self.rate)} of prefill left in this run ({tokens:,} tokens at the last "
                    f"first load's {self.rate:,.0f} tokens/s)" if tokens else "no planned prefill left in this run")
            print(f"estimate: {said}; a noise band, where a reused output differs, comes on top", file=self.out,
                  flush=True)

    def of(self, tokens: int) -> str:
        """How long prefilling `tokens` takes at the last first load's rate: "about 3 min 45 s", or "" unknown."""
        return f"about {_duration(tokens / self.rate)}" if self.rate else ""

    def session_ended(self, session: str) -> None:
        self.left[session] = []


def _duration(seconds: float) -> str:
    """"42 s", "1 min 35 s", "17 min", "2.5 h"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
