"""The prefill rate a prediction's seconds come from: this profile's variant on this box, from its last replay, else
from a short replay made now. It says which, and the tokens and seconds it is made of."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reusebench import records
from reusebench.records import Role
from reusebench.run.replay import SCENARIO


@dataclass(frozen=True)
class PrefillRate:
    tokens: int
    seconds: float
    source: str  # where the figures come from, in words

    @property
    def per_token_s(self) -> float:
        return self.seconds / self.tokens

    def seconds_for(self, tokens: int) -> float:
        return tokens * self.per_token_s

    def describe(self) -> str:
        return f"{self.tokens:,} tokens prefilled in {self.seconds:.1f} s ({self.source})"


def from_records(path: Path, profile: str, variant: str) -> PrefillRate | None:
    """The rate of the replay in `path` for that variant: its requests' tokens and prefill seconds."""
    tokens, ms = 0, 0.0
    for r in records.read_records(path):
        if r.scenario == SCENARIO and r.role == Role.MEASURE and r.profile == profile and r.variant == variant and \
                r.prompt_n and r.prompt_ms:
            tokens += r.prompt_n
            ms += r.prompt_ms
    return PrefillRate(tokens, ms / 1000, f"replay run {path.parent.name}") if tokens else None


def last_replay(results_dir: Path, profile: str, variant: str) -> PrefillRate | None:
    """The newest replay run under `results_dir` of that variant."""
    for run_dir in sorted((results_dir / "runs").glob("*/"), reverse=True):
        path = run_dir / "records.jsonl"
        if path.is_file():
            found = from_records(path, profile, variant)
            if found is not None:
                return found
    return None
