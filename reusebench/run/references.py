"""A session's no-reuse references (kept by ``verification.References``): which measured steps a cold call
verifies, and which still wait for one at the end of the session."""

from __future__ import annotations

from reusebench.llama.client import Completion
from reusebench.records import Record
from reusebench.reuse.verification import Pending, References, Unjudged, reference_name
from reusebench.run.progress import Progress
from reusebench.run.requests import Request


class ReferenceKeeper:
    """Verifies a reused measured step now when its prompt was computed cold before, else keeps it waiting."""

    def __init__(self, verify: bool, progress: Progress) -> None:
        self.verify, self.progress = verify, progress
        self._references: References[Request] = References()

    def judge(self, record: Record, c: Completion, request: Request) -> None:
        """A measured step that reused something: compare it with its reference, now or later."""
        if c.cache_n == 0 or not self.verify:
            return
        self._references.verify(record, c, request)

    def use(self, record: Record, c: Completion) -> None:
        """A call that reused nothing is the reference of its prompt; it verifies the steps waiting for one."""
        for measured in self._references.add(record, c):
            self.progress.say(f"  {measured.scenario}/{measured.step} ({measured.verdict}): its output "
                              f"{said(measured)} the no-reuse output of {reference_name(record)}, computed later")

    def awaited(self, record: Record) -> bool:
        """Whether `record`'s call, computed without reuse, is the reference a waiting step needs."""
        return self.verify and self._references.awaits(record)

    def waiting(self) -> list[Pending[Request]]:
        return self._references.waiting()

    def unjudged(self) -> list[Unjudged[Request]]:
        return self._references.unjudged()

    def settle(self, band: float) -> list[tuple[Unjudged[Request], list[dict[str, object]]]]:
        settled = self._references.settle(band)
        for waiting, _ in settled:
            for measured, _ in waiting.steps:
                self.progress.say(f"  {measured.scenario}/{measured.step} ({measured.verdict}): its output "
                                  f"{said(measured)} the no-reuse output (noise band {band:.2g})")
        return settled


def said(measured: Record) -> str:
    """How a verified step's output compares, in a few words."""
    check = measured.extra.get("output_check")
    return {"identical": "is identical to", "within noise": "is within the noise of", "WRONG": "DIFFERS from"}.get(
        str(check), "differs, waiting for the noise band, from")
