"""Is a reused output the same as output computed without reuse? One rule, for `run` and `check`.

The rule (``output_difference``): two greedy outputs are the same when they have the same token ids
and every log-probability both report (the chosen token's, and each top-k alternative both list at
a position) agrees within ``LOGPROB_TOLERANCE``.

Why 1e-2: a reused and a cold computation batch the prompt differently (the part that is computed
again starts mid-ubatch), so their floats are summed in another order. Measured with b11434 on
CPU, that noise is at most 3e-5 at 2K but reaches 1.1e-3 at 32K on the pure-attention control,
whose mid-document edit reuses a 16K prefix exactly and recomputes the other 16K: a correct
reuse that a tolerance of 1e-3 called WRONG OUTPUT. 1e-2 sits ten times above the largest noise
measured and still below a flipped greedy token. A state computed under another LoRA moved the
logprobs by only 2e-3 (qwen35) to 7e-3 (nemotron_h) at 2K, inside the noise band of long
prompts: no logprob tolerance separates the two, so the session flags that case from its own
history (FOREIGN REUSE) instead of from the output. A difference names positions, token ids and
logprobs, never text.

Also here: where runs of token ids first part (``common_prefix``), which both the perfect-cache
``ideal`` and the comparison use, and the bookkeeping of no-reuse references (``References``):
steps with the same prompt and LoRA share one reference, and a step whose reference is not
computed yet waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from reusebench.llama.client import Completion
from reusebench.records import Record, Role, apply_verification, step_id

LOGPROB_TOLERANCE = 1e-2


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids `a` and `b` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def token_difference(got: Completion, reference: Completion) -> str | None:
    """Where two outputs' token ids first differ, or their lengths do; None when the ids are the same."""
    shared = common_prefix(got.tokens, reference.tokens)
    if shared < min(len(got.tokens), len(reference.tokens)):
        return f"token {shared}: id {got.tokens[shared]} != reference id {reference.tokens[shared]}"
    if len(got.tokens) != len(reference.tokens):
        return f"length {len(got.tokens)} != reference {len(reference.tokens)}"
    return None


def logprob_deltas(got: Completion, reference: Completion) -> list[tuple[int, int, float, float]]:
    """(position, token id, logprob, reference logprob) for every token both outputs give a logprob for at a position:
    the chosen token and each top-k alternative both list."""
    found = []
    for position, (a, b) in enumerate(zip(got.probs, reference.probs)):
        theirs = {b.id: b.logprob, **dict(b.top)}
        ours = {a.id: a.logprob, **dict(a.top)}
        found += [(position, token, logprob, theirs[token]) for token, logprob in ours.items() if token in theirs]
    return found


def max_logprob_delta(got: Completion, reference: Completion) -> float:
    """How close "same" was: the largest |logprob difference| the rule looked at (0.0 when there were none)."""
    return max((abs(a - b) for _, _, a, b in logprob_deltas(got, reference)), default=0.0)


def output_difference(got: Completion, reference: Completion, tolerance: float = LOGPROB_TOLERANCE) -> str | None:
    """None when the two outputs are the same by the rule above; otherwise where they first differ."""
    differs = token_difference(got, reference)
    if differs is not None:
        return differs
    for position, token, logprob, expected in logprob_deltas(got, reference):
        if abs(logprob - expected) > tolerance:
            return (f"token {position}: logprob of id {token} {logprob:.5f} != reference {expected:.5f} "
                    f"(> {tolerance:g} apart)")
    return None


RequestT = TypeVar("RequestT")


@dataclass
class Pending(Generic[RequestT]):
    """Measured steps waiting for a no-reuse reference of their prompt (same tokens and LoRA), and how to ask."""

    request: RequestT
    steps: list[tuple[Record, Completion]] = field(default_factory=list)


def reference_key(record: Record) -> tuple[str, str]:
    """Steps with the same prompt tokens and LoRA share one no-reuse reference."""
    return record.prompt_hash or "", record.lora or ""


def reference_name(record: Record) -> str:
    """How a verified step names the call that verified it: "scenario/step", with the role unless a measured step."""
    return f"{record.scenario}/{record.step}" + ("" if record.role == Role.MEASURE else f" ({record.role})")


def comparison(record: Record, got: Completion, reference: Completion, by: str) -> dict[str, Any]:
    """One entry of ``extra["verifies"]``: the measured step, and whether its output equals the reference."""
    mismatch = output_difference(got, reference)
    return {**step_id(record), "matches_reference": mismatch is None, "mismatch": mismatch,
            "max_logprob_delta": max_logprob_delta(got, reference), "by": by}


class References(Generic[RequestT]):
    """The no-reuse reference of each prompt and LoRA seen so far, and the measured steps still waiting for one."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str], tuple[Completion, str]] = {}  # key -> (completion, "scenario/step")
        self._pending: dict[tuple[str, str], Pending[RequestT]] = {}

    def verify(self, record: Record, got: Completion, request: RequestT) -> None:
        """Compare a measured step with its reference now, or keep it waiting for one (``reference: deferred``)."""
        key = reference_key(record)
        if key in self._known:
            reference, by = self._known[key]
            apply_verification(record, comparison(record, got, reference, by))
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
        checks = [comparison(measured, got, reference, by) for measured, got in pending.steps]
        for (measured, _), check in zip(pending.steps, checks):
            apply_verification(measured, check)
        record.extra["verifies"] = checks
        return [measured for measured, _ in pending.steps]

    def awaits(self, record: Record) -> bool:
        """Whether a measured step waits for the no-reuse reference of `record`'s prompt and LoRA."""
        return reference_key(record) in self._pending

    def waiting(self) -> list[Pending[RequestT]]:
        """The prompts no call has computed without reuse yet, each with the steps that wait for it."""
        return list(self._pending.values())
