"""A session's prefill budget: every prompt token the suite made the server prefill, by role, against what the
measured steps themselves required (``PrefillBudget``), summed as the calls are written (``add_prefilled``) or read
back from records (``prefill_budgets``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reusebench.records import Record, Role

PREFILL_ROLES = (Role.SETUP, Role.MEASURE, Role.REFERENCE)  # what a session's prefill budget sums
NEEDED = "needed"  # beside them: what the measured steps re-processed, stopped or not


@dataclass(frozen=True)
class PrefillBudget:
    """Prompt tokens a session made the server prefill, by role, against what its measured steps needed.

    `needed` is what the measured steps re-processed (their prompt_n); `measured` what the server prefilled
    for them, less where a step stopped once its count was known. `size` is the session's document size.
    """

    session: str
    measured: int
    setup: int
    reference: int
    needed: int
    size: int = 0

    @classmethod
    def of(cls, session: str, by_role: Mapping[str, int], size: int = 0) -> PrefillBudget:
        """From prefilled tokens by role and `needed` (a summary record's ``extra["prefill"]``, or sums over
        records; records written before early stop have no `needed`: every step ran to its end)."""
        return cls(session, by_role[Role.MEASURE], by_role[Role.SETUP], by_role[Role.REFERENCE],
                   by_role.get(NEEDED, by_role[Role.MEASURE]), size)

    def to_dict(self) -> dict[str, int]:
        """As a summary record's ``extra["prefill"]``."""
        return {Role.SETUP: self.setup, Role.MEASURE: self.measured, Role.REFERENCE: self.reference,
                NEEDED: self.needed}

    @property
    def total(self) -> int:
        return self.measured + self.setup + self.reference

    @property
    def extra(self) -> int:
        """Tokens prefilled beyond what the measured steps required (setup and reference prefills)."""
        return self.setup + self.reference

    @property
    def ratio(self) -> float | None:
        """All prefilled tokens over those the measured steps needed (1.0: nothing extra)."""
        return self.total / self.needed if self.needed else None

    @property
    def documents(self) -> float | None:
        """All prefilled tokens in documents of the session's size: full prefills' worth."""
        return self.total / self.size if self.size else None

    def line(self) -> str:
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.2f}"
        documents = "" if self.documents is None else f" ({self.documents:.2f} documents)"
        stopped = "" if self.measured == self.needed else (f", {self.needed - self.measured:,} of them not prefilled: "
                                                           "stopped at their count")
        return (f"{self.session}: prefill budget {ratio} ({self.total:,} tokens prefilled{documents} for "
                f"{self.needed:,} measured{stopped}; setup {self.setup:,}, reference {self.reference:,})")


def prefill_budgets(records: Iterable[Record]) -> list[PrefillBudget]:
    """One budget per session, in the order first seen: the tokens each record's call really prefilled
    (records without a count, e.g. failed calls, add 0)."""
    sums: dict[str, dict[str, int]] = {}
    sizes: dict[str, int] = {}
    for r in records:
        sizes.setdefault(r.session, r.size)
        add_prefilled(sums.setdefault(r.session, new_prefill_sums()), r)
    return [PrefillBudget.of(session, s, sizes[session]) for session, s in sums.items()]


def new_prefill_sums() -> dict[str, int]:
    return dict.fromkeys((*PREFILL_ROLES, NEEDED), 0)


def add_prefilled(by_role: dict[str, int], r: Record) -> None:
    """Add one record's call to a session's prefill sums: what it prefilled by role, what a measured step needed."""
    prefilled = r.prompt_n if r.prefilled_n is None else r.prefilled_n  # records before prefilled_n
    if prefilled is not None and r.role in by_role:
        by_role[Role(r.role)] += prefilled
    if r.prompt_n is not None and r.role == Role.MEASURE:
        by_role[NEEDED] += r.prompt_n
