"""The verdict rules: hit, partial or miss (``outcome``), the verdict word of a measured step (``verdict``), the
error of an interrupted call, and the deferred verifications a later record applies back to measured ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reusebench.records.schema import Record, Role

HIT_TOLERANCE = 8  # tokens over the ideal that still count as a hit (hybrids stop 4 tokens short)
# Tokens by which a measured prompt_n may differ from the reuse model's (reusebench.reuse.expectation) before the step
# is UNEXPECTED. Zero: the model works on the token ids the server is sent and the server's rules are integer
# arithmetic on them, so there is no noise to allow for; every token of difference is a rule the model lacks.
EXPECTED_TOLERANCE = 0


class StepVerdict(StrEnum):
    """A measured step's verdict, as records keep it (the value) and reports and pages compare it."""

    HIT = "hit"
    PARTIAL = "partial"
    MISS = "miss"
    FULL = "full (cannot hit)"
    WRONG_OUTPUT = "WRONG OUTPUT"
    UNEXPECTED = "UNEXPECTED"
    NOT_MODELLED = "NOT MODELLED"
    FOREIGN_REUSE = "FOREIGN REUSE"


def deviation(r: Record) -> int | None:
    """Measured minus expected prompt_n, when both are known."""
    return None if r.expected is None or r.prompt_n is None else r.prompt_n - r.expected


def images_reprocessed(r: Record) -> list[int]:
    """The tokens of each image a step re-processed: those after what it kept (an image is kept whole or not at
    all); none without images."""
    kept = r.cache_n or 0
    return [length for start, length in r.extra.get("image_spans") or [] if start >= kept]


@dataclass(frozen=True)
class Drafts:
    """What the server's log says of a speculating step's drafts: those verified, those with a token rejected (each
    of which put the server's state back to where the draft began) and, of them, those undone from a speculative
    checkpoint rather than rolled back in place."""

    verified: int
    rolled_back: int
    from_checkpoint: int


def drafts(r: Record) -> Drafts | None:
    """A step's drafts from its cause; None where they are not known: no speculation, or a server that did not log
    its drafts (``facts.TRACE_ENV``, which the suite sets on the servers it starts)."""
    drafted, cause = r.extra.get("draft_n"), r.cause or {}
    if drafted is None or (drafted and not cause.get("drafts")):
        return None
    return Drafts(int(cause.get("drafts", 0)), int(cause.get("drafts_rolled_back", 0)),
                  int(cause.get("spec_checkpoints_restored", 0)))


def drafts_rolled_back(r: Record) -> int | None:
    """The drafts of a step's answer with a token rejected (``drafts``); None where not known."""
    known = drafts(r)
    return None if known is None else known.rolled_back


def interrupted(why: str = "Ctrl-C") -> str:
    """The error of a call cut short because its run stopped (Ctrl-C, SIGTERM, the tap stopped): one spelling for
    the session, the workload and the tap."""
    return f"interrupted ({why})"


def was_interrupted(error: str | None) -> bool:
    return bool(error) and str(error).startswith("interrupted (")


def outcome(r: Record, shared: int = 0) -> StepVerdict:
    """The one rule for hit, partial and miss, for every report and page: a hit re-processed no more than
    HIT_TOLERANCE tokens over what a perfect cache would; a miss reused nothing beyond `shared` tokens (a system
    prompt every conversation of a service starts with; 0 for a scenario); partial lies between. Whether the turn
    should hit is the record's own ``expected_hit``."""
    if (r.excess or 0) <= HIT_TOLERANCE:
        return StepVerdict.HIT
    return StepVerdict.MISS if (r.cache_n or 0) <= shared else StepVerdict.PARTIAL


def verdict(r: Record, shared: int = 0) -> StepVerdict:
    """One word per measured step: hit, partial, miss, full (cannot hit), wrong output, foreign reuse,
    UNEXPECTED when prompt_n is not what the reuse model predicts (a wrong output outranks it: the
    report's output column and cause columns still show both), or NOT MODELLED where the model predicts nothing
    for this memory (``extra["not_modelled"]`` says why). `shared` is ``outcome``'s: a workload's turn that reused
    no more than the system prompt is a miss (or full, when it cannot hit), as its service report counts it."""
    if r.matches_reference is False:
        return StepVerdict.WRONG_OUTPUT
    if abs(deviation(r) or 0) > EXPECTED_TOLERANCE:
        return StepVerdict.UNEXPECTED
    if r.extra.get("not_modelled"):
        return StepVerdict.NOT_MODELLED
    if r.extra.get("foreign_reused"):
        return StepVerdict.FOREIGN_REUSE
    if not r.expected_hit and (r.cache_n or 0) <= max(HIT_TOLERANCE, shared):
        return StepVerdict.FULL
    return outcome(r, shared)


def step_id(r: Record) -> dict[str, Any]:
    """What names one measured record inside its session, for ``extra["verifies"]``."""
    return {"scenario": r.scenario, "step": r.step, "started_at": r.started_at}


def apply_verification(measured: Record, check: dict[str, Any]) -> None:
    """Set a measured record's correctness fields from one entry of a reference's ``extra["verifies"]``."""
    measured.matches_reference = check["matches_reference"]
    measured.mismatch = check.get("mismatch")
    for name in ("output_check", "output_delta", "noise_band"):
        measured.extra[name] = check.get(name)
    measured.extra["verified_by"] = check.get("by")
    measured.verdict = verdict(measured)


def resolve_verifications(records: Sequence[Record]) -> None:
    """Apply every deferred verdict (``extra["verifies"]`` of a later record) to the measured record it names."""
    index = {(r.run_id, r.session, r.scenario, r.step, r.started_at): r for r in records if r.role == Role.MEASURE}
    for reference in records:
        for check in reference.extra.get("verifies") or ():
            target = index.get((reference.run_id, reference.session, check["scenario"], check["step"],
                                check["started_at"]))
            if target is not None:
                apply_verification(target, check)
