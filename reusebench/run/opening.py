"""Every run's opening and closing: a new run directory with its run.json (the run's kind, launches, builds,
rules and selection) and the writer of its records, flushed and closed on every way out. Used by every command
and asv benchmark that records."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reusebench.records import RecordWriter, read_records
from reusebench.run import provenance
from reusebench.run.recording import RunDir


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the drivers stopped their servers; every record written is kept."""

    def __init__(self, records_path: Path, kept: int) -> None:
        super().__init__()
        self.records_path, self.kept = records_path, kept

    def summary(self) -> str:
        return f"interrupted: every server stopped; {self.kept} records kept in {self.records_path}"


def stamped_run(results_dir: Path, stamp: provenance.Stamp) -> RunDir:
    """A new run under `results_dir` with its run.json, for a run that records no calls (an option check's, a
    prediction's)."""
    run = RunDir.create(results_dir)
    provenance.write(run.path, stamp)
    return run


def opened_run(results_dir: Path, stamp: provenance.Stamp) -> tuple[RunDir, RecordWriter]:
    """A new run and the writer of its records, for a driver whose run ends when it is stopped, not at the end of a
    block (the tap): the driver closes the writer with its summary."""
    run = stamped_run(results_dir, stamp)
    return run, RecordWriter(run.records_path)


@contextmanager
def open_run(results_dir: Path, stamp: provenance.Stamp) -> Iterator[tuple[RunDir, RecordWriter]]:
    """A new run under `results_dir` stamped with `stamp`, and the writer of its records; Ctrl-C inside becomes
    ``Interrupted`` with what was kept."""
    run = stamped_run(results_dir, stamp)
    try:
        with RecordWriter(run.records_path) as writer:
            yield run, writer
    except KeyboardInterrupt:  # every driver stopped its server on the way out; the writer flushed every record
        raise Interrupted(run.records_path, len(read_records(run.records_path))) from None
