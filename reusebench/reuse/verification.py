"""Is a reused output the output computed without reuse? One rule, for `run` and `check`.

A reused computation batches the prompt differently from a cold one (the part computed again starts
mid-ubatch), so on real weights its logits move a little, and a near-tie can flip a greedy token: llama.cpp
does not promise the same floats across batch shapes. So "the same output" cannot mean equal numbers. The
rule (``difference``, then ``judge``):

- Compare the two outputs teacher-forced: position by position while their tokens agree, up to and including
  the first token where they differ, and nothing after it (after a flipped near-tie the two continue from
  different text, and their distributions say nothing about reuse).
- At each compared position, the largest difference in probability of any token that both top-k lists hold
  (one list only: at least its probability less the other list's k-th), over the probability of the
  position's most likely token.
- identical: the same tokens and the same logprobs; same within the noise: the largest difference is at most
  ``NOISE_MARGIN`` times the noise band (and never less than ``NOISE_FLOOR``); WRONG beyond it.

The noise band is measured, not assumed: the same difference between two correct computations that differ only
in batch shape, the no-reuse reference at the server's ubatch and at an odd size near a quarter of it
(``alternative_ubatch``) on the same server restarted at that ubatch (``run.noise.measure``). Odd, because a
reused step's batches start and end anywhere: a batch whose size the kernels' tiles do not divide takes other
code paths. Tiny llama at
32K: a resend (its last token computed alone) differs by 7.1e-4 from no reuse; no reuse at ubatch 128 by 0,
at 127 by 2.5e-3. Measured on Gemma 3 270M Q4_K_M (b11434, CPU, the python-docs corpus, report A): the band
is 0.19 at 4K and 0.26 at 8K, and a correct resend or re-ask differs by 0.3-0.95 times it. On 2026-03, whose
restore keeps the slot's checkpoints, a re-ask that returns to another document's checkpoint (past its
divergence) differs by 4.7 times the band. Probability, not logprob: a real model's top-5 holds tokens of
probability 1e-5 whose logprobs move by tenths of a nat with the batch shape while nothing that matters moves;
and over the top token's probability, so a random model's flat distribution reads on the same scale.

What no output can show (a wrong state whose effect stays inside the noise), the session flags from its history
where the reuse model knows the state to be foreign (FOREIGN REUSE, ``expected_wrong_output``).

The comparison itself (``difference``) and where two runs of ids part (``common_prefix``) are
``llama.outputs``'. Also here: the bookkeeping of no-reuse references (``References``): steps with the same prompt and
LoRA share one reference, and a step whose reference is not computed yet waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from reusebench.llama.client import Completion
from reusebench.llama.outputs import Difference, difference
from reusebench.records import Record, Role, apply_verification, step_id

NOISE_MARGIN = 3.0  # a difference up to this many noise bands is noise
# Differences below this are noise whatever the band. A reuse through another slot of a unified cache reads its
# keys in another cell order, and a reused step's batches start where the kept prefix ends; both move the sums in
# their last bits where a change of ubatch alone may move nothing, and a random model's flat distribution shows
# it. Measured on tiny models whose band was 0 or 9e-7: correct reuse up to 1.0e-3 (tiny-llama's 32K edit, make
# bench); the smallest wrong one 0.015 (a window with a hole).
NOISE_FLOOR = 5e-3
ALT_UBATCH_DIVISOR = 4  # the band's second computation runs near a quarter of the server's ubatch
IDENTICAL, WITHIN_NOISE, WRONG = "identical", "within noise", "WRONG"


def judge(found: Difference, band: float | None) -> str | None:
    """identical, within noise or WRONG; None while a non-identical output waits for its noise band."""
    if found.identical:
        return IDENTICAL
    if band is None:
        return None
    return WITHIN_NOISE if found.delta <= max(NOISE_MARGIN * band, NOISE_FLOOR) else WRONG


def alternative_ubatch(n_ubatch: int) -> int:
    """The ubatch of the noise band's second computation: odd, near a quarter of the server's (127 for 512)."""
    quarter = n_ubatch // ALT_UBATCH_DIVISOR
    return max(1, quarter - 1 if quarter % 2 == 0 else quarter)


RequestT = TypeVar("RequestT")


@dataclass
class Pending(Generic[RequestT]):
    """Measured steps waiting for a no-reuse reference of their prompt (same tokens and LoRA), and how to ask."""

    request: RequestT
    steps: list[tuple[Record, Completion]] = field(default_factory=list)


@dataclass
class Unjudged(Generic[RequestT]):
    """Measured steps whose output is not identical to their prompt's reference, waiting for a noise band."""

    request: RequestT
    reference: Completion
    by: str
    steps: list[tuple[Record, Completion]] = field(default_factory=list)


def reference_key(record: Record) -> tuple[str, str]:
    """Steps with the same prompt tokens and LoRA share one no-reuse reference."""
    return record.prompt_hash or "", record.lora or ""


def reference_name(record: Record) -> str:
    """How a verified step names the call that verified it: "scenario/step", with the role unless a measured step."""
    return f"{record.scenario}/{record.step}" + ("" if record.role == Role.MEASURE else f" ({record.role})")


def comparison(record: Record, got: Completion, reference: Completion, by: str,
               band: float | None = None) -> dict[str, Any]:
    """One entry of ``extra["verifies"]``: the measured step, and how its output compares with the reference
    (``judge``; ``matches_reference`` None while it waits for a noise band)."""
    found = difference(got, reference)
    outcome = judge(found, band)
    return {**step_id(record), "matches_reference": None if outcome is None else outcome != WRONG,
            "mismatch": None if outcome in (IDENTICAL, WITHIN_NOISE) else found.describe(),
            "output_check": outcome, "output_delta": found.delta, "noise_band": band, "by": by}


class References(Generic[RequestT]):
    """The no-reuse reference of each prompt and LoRA seen so far, the measured steps still waiting for one, and
    those compared but waiting for a noise band."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], tuple[Completion, str]] = {}  # key -> (completion, "scenario/step")
        self._pending: dict[tuple[str, str], Pending[RequestT]] = {}
        self._unjudged: dict[tuple[str, str], Unjudged[RequestT]] = {}

    def verify(self, record: Record, got: Completion, request: RequestT) -> None:
        """Compare a measured step with its reference now, or keep it waiting for one (``reference: deferred``)."""
        key = reference_key(record)
        if key in self._known:
            reference, by = self._known[key]
            self._compared(key, request, reference, by, record, got)
        else:
            self._pending.setdefault(key, Pending(request)).steps.append((record, got))
            record.extra["reference"] = "deferred"

    def add(self, record: Record, reference: Completion) -> list[Record]:
        """A call that reused nothing is the reference of its prompt: it verifies the steps that waited for it.

        The verdicts go onto those steps' in-memory records and, as ``extra["verifies"]``, onto `record`
        (the file is append-only, so the reader applies them from there). Returns the verified steps.
        """
        key = reference_key(record)
        by = reference_name(record)
        self._known.setdefault(key, (reference, by))
        pending = self._pending.pop(key, None)
        if pending is None:
            return []
        record.extra["verifies"] = [self._compared(key, pending.request, reference, by, measured, got)
                                    for measured, got in pending.steps]
        return [measured for measured, _ in pending.steps]

    def _compared(self, key: tuple[str, str], request: RequestT, reference: Completion, by: str, record: Record,
                  got: Completion) -> dict[str, Any]:
        check = comparison(record, got, reference, by)
        apply_verification(record, check)
        if check["output_check"] is None:
            self._unjudged.setdefault(key, Unjudged(request, reference, by)).steps.append((record, got))
        return check

    def awaits(self, record: Record) -> bool:
        """Whether a measured step waits for the no-reuse reference of `record`'s prompt and LoRA."""
        return reference_key(record) in self._pending

    def waiting(self) -> list[Pending[RequestT]]:
        """The prompts no call has computed without reuse yet, each with the steps that wait for it."""
        return list(self._pending.values())

    def unjudged(self) -> list[Unjudged[RequestT]]:
        """The prompts whose reused outputs differ from the reference and wait for a noise band."""
        return list(self._unjudged.values())

    def settle(self, band: float) -> list[tuple[Unjudged[RequestT], list[dict[str, Any]]]]:
        """Judge every step that waited for a noise band against `band`: each prompt with its steps' verdicts (for
        the band record's ``extra["verifies"]``); the in-memory records get them too."""
        settled = []
        for waiting in self._unjudged.values():
            checks = [comparison(record, got, waiting.reference, waiting.by, band) for record, got in waiting.steps]
            for (record, _), check in zip(waiting.steps, checks):
                apply_verification(record, check)
            settled.append((waiting, checks))
        self._unjudged.clear()
        return settled
