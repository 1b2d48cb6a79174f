"""Run a profile: every variant x size as one session, all records in one run directory.

Used by ``reusebench run`` and by the asv suite's ``setup_cache``. A run never
reuses a directory, so a second run cannot overwrite the first.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reusebench import corpus, profiles, records, scenarios
from reusebench.gpu import GpuSampler
from reusebench.session import Session


@dataclass(frozen=True)
class RunResult:
    run_id: str
    run_dir: Path
    records: list[records.Record]
    failed_sessions: int

    @property
    def records_path(self) -> Path:
        return self.run_dir / "records.jsonl"


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def run_profile(
    profile: profiles.Profile,
    *,
    results_dir: Path,
    variants: Sequence[str] = (),
    sizes: Sequence[int] = (),
    scenario_ids: Sequence[str] = (),
    corpus_name: str = "tiny-words",
    verify: bool = True,
    out: TextIO = sys.stderr,
) -> RunResult:
    """Run the selected variants and sizes (default: all the profile names) and return what was recorded."""
    chosen = [profile.variant(v) for v in variants] if variants else list(profile.variants)
    spec = corpus.load_spec(corpus_name)
    run_id = new_run_id()
    run_dir = Path(results_dir) / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=False)
    records_path = run_dir / "records.jsonl"
    print(f"run {run_id}: profile {profile.name}, {len(chosen)} variant(s), records -> {records_path}", file=out)
    failed = 0
    with records.RecordWriter(records_path) as writer, GpuSampler() as sampler:
        if sampler.unavailable:
            print(f"GPU state will be null: {sampler.unavailable}", file=out)
        for variant in chosen:
            selected = scenarios.select(scenario_ids or variant.scenarios)
            for size in sizes or variant.sizes:
                session = Session(variant, size, spec, writer, run_id=run_id, log_dir=run_dir / "logs",
                                  sampler=sampler, verify=variant.verify and verify, out=out)
                failed += session.run(selected).error is not None
    return RunResult(run_id, run_dir, records.read_records(records_path), failed)
