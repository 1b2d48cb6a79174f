"""What `reusebench check` says about an option: a verdict, the evidence for it, and the codes asv tracks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reusebench.config.profiles import OptionValue


class Verdict(StrEnum):
    ACTIVE = "ACTIVE"
    DISABLED = "DISABLED"
    INEFFECTIVE = "INEFFECTIVE"
    UNSAFE = "UNSAFE"
    UNSUPPORTED = "UNSUPPORTED"
    UNVERIFIED = "UNVERIFIED"


# Tracked by asv as numbers, so a commit that changes a verdict shows in the web UI.
# Stable: never renumber; a new verdict gets the next free number.
VERDICT_CODES: dict[Verdict, int] = {
    Verdict.UNVERIFIED: 0,
    Verdict.ACTIVE: 1,
    Verdict.DISABLED: 2,
    Verdict.INEFFECTIVE: 3,
    Verdict.UNSAFE: 4,
    Verdict.UNSUPPORTED: 5,
}

# Verdicts that make `reusebench check` exit with status 1; with --strict also an option that does nothing.
FAILING_VERDICTS = (Verdict.UNSAFE, Verdict.UNSUPPORTED)
STRICT_FAILING_VERDICTS = (*FAILING_VERDICTS, Verdict.DISABLED, Verdict.INEFFECTIVE)


@dataclass(frozen=True)
class OptionVerdict:
    """One verdict: the option as the profile writes it, its value, and why."""

    option: str
    value: str
    verdict: Verdict
    evidence: tuple[str, ...]
    aspect: str | None = None  # one option can get several verdicts, e.g. slot-save-path "resend after restart"

    @property
    def key(self) -> str:
        """Stable name for asv: ``option`` or ``option[aspect]``."""
        return f"{self.option}[{self.aspect}]" if self.aspect else self.option

    @property
    def code(self) -> int:
        return VERDICT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {
            "option": self.option, "aspect": self.aspect, "value": self.value, "verdict": self.verdict.value,
            "code": self.code, "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class Setting:
    """What a probe checks: the option's name, the value it was given, how to show it."""

    option: str  # as the profile writes it, or the probed name for an unset default
    label: str
    value: OptionValue | None = None  # for the probed option ("no-x: true" gives False); None: the default

    def verdict(self, verdict: Verdict, *evidence: str, aspect: str | None = None) -> OptionVerdict:
        return OptionVerdict(self.option, self.label, verdict, tuple(evidence), aspect)


def tracked_codes(verdicts: Sequence[OptionVerdict]) -> dict[str, int]:
    """{option: verdict code}, the numbers asv tracks (benchmarks/verdicts.py): an option judged in several
    aspects tracks its highest code, the most severe."""
    codes: dict[str, int] = {}
    for verdict in verdicts:
        codes[verdict.option] = max(codes.get(verdict.option, 0), verdict.code)
    return codes
