"""What kind a recorded run is, asked in one place: as its run.json names it; for a run from before run.json kept
its kind, from the file it left (an option check's verdicts, whatif's ranking) or its records."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from reusebench import records
from reusebench.records import Record, RunKind, run_kind
from reusebench.run import provenance

CHECK_FILE = "check.json"  # an option check's verdicts, beside its page
WHATIF_FILE = "whatif.json"  # whatif's ranked combinations, beside its page


def of_run(run_dir: Path) -> RunKind:
    stamp = provenance.read(run_dir)
    if stamp is not None and stamp.kind:
        return RunKind(stamp.kind)
    if (run_dir / CHECK_FILE).is_file():
        return RunKind.CHECK
    if (run_dir / WHATIF_FILE).is_file():
        return RunKind.WHATIF
    path = run_dir / "records.jsonl"
    return run_kind.guessed(records.read_records(path) if path.is_file() else [])


def by_run_id(rs: Iterable[Record], known: Mapping[str, RunKind] | None = None) -> dict[str, RunKind]:
    """Each run's kind among records of several runs: `known` (from their run.json), else from its records."""
    runs: dict[str, list[Record]] = {}
    for r in rs:
        runs.setdefault(r.run_id, []).append(r)
    known = known or {}
    return {run_id: known.get(run_id) or run_kind.guessed(one) for run_id, one in runs.items()}
