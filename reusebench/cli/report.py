"""`reusebench report` (tables from recorded runs) and `reusebench view` (their HTML pages)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reusebench import records
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.records import RunKind
from reusebench.report import run_kinds, run_report, view


def cmd_report(args: argparse.Namespace) -> int:
    recorded = [str(p) for p in sorted((Path(args.results) / "runs").glob("*")) if (p / "records.jsonl").is_file()]
    paths = common.records_paths(args.paths or recorded[-args.last:])  # an option check's run directory has no records
    missing = [p for p in paths if not p.is_file()]
    if not paths or missing:
        print(f"reusebench report: no records at {', '.join(map(str, missing)) or args.results}", file=sys.stderr)
        return Exit.USAGE
    measured = records.read_many(paths)
    width = None if args.wide else common.TERMINAL_COLUMNS
    kinds = {path.parent.name: run_kinds.of_run(path.parent) for path in paths}  # a run's id names its directory
    print(run_report.summary_json(measured) if args.json else run_report.render_text(measured, width, kinds))
    return Exit.OK


def add_report(sub: common.Subparsers) -> None:
    rep = common.add_command(sub, "report", "tables from recorded runs (default: the latest run)", "Tables from "
                             "recorded runs, as `run` and `workload` print them at their end (default: the newest "
                             "run under --results).")
    rep.add_argument("paths", nargs="*", help="run directories or records.jsonl files")
    rep.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    rep.add_argument("--last", type=int, default=1, metavar="N", help="without paths: the N newest runs (default 1)")
    common.add_wide(rep)
    common.add_json(rep)
    rep.set_defaults(func=cmd_report)


def cmd_view(args: argparse.Namespace) -> int:
    results = Path(args.results)
    run_dirs = [Path(p) if Path(p).is_dir() else results / "runs" / p for p in args.runs] or sorted(
        (results / "runs").glob("*/"))[-1:]
    if not run_dirs:
        print(f"reusebench view: no runs under {results / 'runs'}", file=sys.stderr)
        return Exit.USAGE
    for run_dir in run_dirs:
        if run_kinds.of_run(run_dir) is RunKind.CHECK:
            print(view.write_check_page(run_dir, json.loads((run_dir / run_kinds.CHECK_FILE).read_text())))
            continue
        if not (run_dir / "records.jsonl").is_file():
            print(f"reusebench view: {run_dir}: no records.jsonl or {run_kinds.CHECK_FILE}", file=sys.stderr)
            return Exit.USAGE
        print(view.write_run_page(run_dir))
    # the list goes beside `runs/`: the results directory the run is in, else --results
    print(view.write_index(run_dirs[0].parent.parent if run_dirs[0].parent.name == "runs" else results),
          file=common.progress(args))
    return Exit.OK


def add_view(sub: common.Subparsers) -> None:
    page = common.add_command(
        sub, "view", "write a run's HTML page and the list of all pages", "Write a run's HTML page "
        "(results/runs/RUN_ID/index.html: a scenario run's steps as re-processed, ideal and expected tokens on a log "
        "axis with verdicts and causes; a workload's timeline with a lane per slot and its requests by user; an option "
        "check's verdicts) and the list of all pages (results/index.html). " + common.PAGES_WRITTEN_BY)
    page.add_argument("runs", nargs="*", metavar="RUN", help="run directories or run ids (default: the newest run)")
    page.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    page.set_defaults(func=cmd_view)
