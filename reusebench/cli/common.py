"""What the commands share: the results directory, argument types, the clean stop, and a finished run's report."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, TypeAlias

from reusebench import records
from reusebench.config import sizes
from reusebench.llama import process
from reusebench.report import run_report, service_runs, view

RESULTS_DIR = Path("results")
# what ArgumentParser.add_subparsers returns; every command module adds its parsers to it
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def token_size(text: str) -> int:
    """An argparse type: a prompt size in tokens (2048, 32K, 1M)."""
    try:
        return sizes.parse_size(text)
    except sizes.SizeError as error:  # argparse prefixes "argument --size: "
        raise argparse.ArgumentTypeError(str(error)) from None


def records_paths(given: Sequence[str]) -> list[Path]:
    """Run directories or records.jsonl files, as records.jsonl paths."""
    return [Path(p) / "records.jsonl" if Path(p).is_dir() else Path(p) for p in given]


def terminated(signum: int, frame: object) -> None:
    """SIGTERM (kill, systemd): the same clean stop as Ctrl-C, records kept, servers stopped; a second one waits."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def interrupted(kept: Callable[[], str]) -> int:
    """After Ctrl-C or SIGTERM: every server stopped, then what was kept said on stderr; the exit status, 130."""
    process.stop_all()
    print("\n" + kept(), file=sys.stderr)
    return 130


class Written(NamedTuple):
    """A finished run's report: its text (also in report.md) and its page."""

    text: str
    page: Path


def write_run_report(run_dir: Path, title: str, scenario_records: Sequence[records.Record] | None = None) -> Written:
    """A finished run's report.md (headed "# reusebench TITLE"), its page and the results' list of pages.

    A service run's report (a workload's, a tap's) is read from its records.jsonl; a scenario run (`run`) passes the
    records it returns as `scenario_records`, whose report is the scenario tables, with its summary.json beside.
    """
    if scenario_records is None:
        text = service_runs.render_runs(records.read_records(run_dir / "records.jsonl"))
    else:
        text = run_report.render_text(scenario_records)
    (run_dir / "report.md").write_text(f"# reusebench {title}\n\n{text}\n")
    if scenario_records is not None:
        (run_dir / "summary.json").write_text(run_report.summary_json(scenario_records))
    page = view.write_run_page(run_dir)
    view.write_index(run_dir.parent.parent)  # a run is RESULTS/runs/RUN_ID: the list goes beside `runs/`
    return Written(text, page)
