"""What the commands share: their parser's shape, the results directory, argument types, the progress stream, the
clean stop, and a finished run's report."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO, TypeAlias

from reusebench import records
from reusebench.cli import exits
from reusebench.config import sizes
from reusebench.llama import process
from reusebench.report import replay_report, run_kinds, run_report, service_runs, view
from reusebench.run.progress import fitted

RESULTS_DIR = Path("results")
# what ArgumentParser.add_subparsers returns; every command module adds its parsers to it
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
ENVIRONMENT_DOC = "docs/environment.md"
PAGES_WRITTEN_BY = ("`run`, `workload`, `tap` and `check` write their run's page and the list when they end; `view` "
                    "writes them again from a run's files.")
EPILOG = f"{exits.table()}\n\nenvironment variables: {ENVIRONMENT_DOC} in the reusebench repository"
COMMAND_EPILOG = f"{exits.short()}\nenvironment variables: {ENVIRONMENT_DOC} in the reusebench repository"


def _verbosity() -> argparse.ArgumentParser:
    """-q and -v, on every command (after its name, as pytest takes them)."""
    options = argparse.ArgumentParser(add_help=False)
    said = options.add_mutually_exclusive_group()
    said.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=0,
                      help="no progress on stderr: only the results (stdout) and errors")
    said.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                      help="also each llama-server's start (its arguments and pid) and stop on stderr")
    return options


VERBOSITY = _verbosity()


def add_command(sub: Subparsers, name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
    """A command's parser: its one-line summary in the list of commands, its description atop its own --help, and
    -q/-v and the exit statuses in one line on every one (the whole table is the top-level --help's)."""
    return sub.add_parser(name, help=summary, description=wrapped(description or summary), epilog=COMMAND_EPILOG,
                          parents=[VERBOSITY], formatter_class=argparse.RawDescriptionHelpFormatter)


def wrapped(text: str) -> str:
    """Paragraphs (apart by a blank line) filled to 100 columns: the epilog's table keeps its own lines."""
    return "\n\n".join(textwrap.fill(paragraph, 100) for paragraph in text.split("\n\n"))


def add_profile(parser: argparse.ArgumentParser, *, required: bool = True, what: str = "") -> None:
    """--profile: how every command names a profile."""
    parser.add_argument("--profile", required=required, metavar="NAME",
                        help=what or "profile name in server_profiles/ (`reusebench profiles`) or a path")


class RenamedToRepeated(argparse.Action):
    """An old spelling that took a list (``--scenarios a b``) and still works, with a note naming the new one, a
    repeated option (``--scenario a --scenario b``); hidden from --help."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="+", help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        spelled = " ".join(f"{self.new} {value}" for value in values)
        print(f"note: {option_string} is now a repeated {self.new}: {spelled}", file=sys.stderr)
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *values])


TERMINAL_COLUMNS = 100  # what a table fits by default; --wide shows every column at full width


def add_wide(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wide", action="store_true", help=f"tables at full width (default: they fit "
                        f"{TERMINAL_COLUMNS} columns)")


def add_json(parser: argparse.ArgumentParser, what: str = "JSON on stdout instead of tables") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def progress(args: argparse.Namespace) -> TextIO:
    """Where a command's progress goes: stderr with each line fitted to the terminal (every line whole with
    --wide), or nowhere with -q."""
    if args.verbosity < 0:
        return open(os.devnull, "w")  # open as long as the command runs
    return sys.stderr if getattr(args, "wide", False) else fitted(sys.stderr, TERMINAL_COLUMNS)


def token_size(text: str) -> int:
    """An argparse type: a prompt size in tokens (2048, 32K, 1M)."""
    try:
        return sizes.parse_size(text)
    except sizes.SizeError as error:  # argparse prefixes "argument --size: "
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_int(text: str) -> int:
    """An argparse type: a count of at least 1 (a limit of 0 would refuse everything)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def positive_float(text: str) -> float:
    """An argparse type: a duration or amount above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def address(text: str) -> tuple[str, int]:
    """An argparse type: HOST:PORT, where a command listens."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. 127.0.0.1:8081, got {text!r}")
    return host, int(port)


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
    return exits.Exit.INTERRUPTED


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
        read = records.read_records(run_dir / "records.jsonl")
        replay = run_kinds.of_run(run_dir) is records.RunKind.REPLAY
        text = replay_report.render(read) if replay else service_runs.render_runs(read)
    else:
        text = run_report.render_text(scenario_records)
    (run_dir / "report.md").write_text(f"# reusebench {title}\n\n{text}\n")
    if scenario_records is not None:
        (run_dir / "summary.json").write_text(run_report.summary_json(scenario_records))
    page = view.write_run_page(run_dir)
    view.write_index(run_dir.parent.parent)  # a run is RESULTS/runs/RUN_ID: the list goes beside `runs/`
    return Written(text, page)
