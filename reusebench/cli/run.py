"""`reusebench run` (a profile's scenarios) and `reusebench workload` (users on one server): measure and report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from reusebench import records
from reusebench.advise.next_steps import next_steps
from reusebench.capability import build
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import profiles, scenarios, workload
from reusebench.records import RunKind
from reusebench.report import run_report, service_runs
from reusebench.run import plan, provenance, runner, session
from reusebench.run.opening import Interrupted, open_run
from reusebench.run.progress import fit
from reusebench.run.selection import Repeats, Selection
from reusebench.run.service import ScheduleDeviation, resolve_for_workload, service_run
from reusebench.tap import InFront


def cmd_run(args: argparse.Namespace) -> int:
    profile = profiles.load_profile(args.profile)  # every option checked against the binary's --help, also for a plan
    repeats = None if args.repeat_first_load is None else Repeats(
        args.repeat_first_load, idle_gap_s=args.idle_gap or 0.0, warm_up=args.warm_up)
    if repeats is None and (args.idle_gap is not None or args.warm_up):
        raise ValueError("--idle-gap and --warm-up go with --repeat-first-load N")
    selection = Selection(tuple(args.variant or ()), tuple(args.size or ()), tuple(args.scenario or ()),
                          corpus_name=args.corpus, verify=not args.no_verify, early_stop=not args.full_prefills,
                          repeats=repeats, on_failure=args.on_failure)
    if args.dry_run:
        planned = plan.render_plan(runner.plan_profile(profile, selection))
        print(planned if args.wide else fit(planned, common.TERMINAL_COLUMNS))
        return Exit.OK
    started = time.monotonic()
    try:
        result = runner.run_profile(profile, selection, results_dir=Path(args.results), out=common.progress(args))
    except Interrupted as exc:
        return common.interrupted(exc.summary)
    except KeyboardInterrupt:  # before its sessions started
        return common.interrupted(lambda: f"interrupted: every server stopped; records kept under "
                                  f"{Path(args.results) / 'runs'}")
    written = common.write_run_report(result.run_dir, f"run {result.run_id}", scenario_records=result.records)
    width = None if args.wide else common.TERMINAL_COLUMNS  # report.md keeps every column
    print(run_report.summary_json(result.records) if args.json else run_report.render_text(result.records, width))
    if args.verbosity >= 0:
        out = common.progress(args)
        print(f"\n{len(result.records)} records in {time.monotonic() - started:.0f} s; "
              f"report: {result.run_dir / 'report.md'}; page: {written.page}", file=out)
        for line in next_steps(profile, result.records):
            print(line, file=out)
    return Exit.FINDING if result.failed_sessions else Exit.OK


def add_run(sub: common.Subparsers) -> None:
    shows = ("run the scenarios of a profile; prints per step the tokens re-processed against a perfect cache's, "
             "prefill seconds, hit or miss, whether the output matched output without reuse, and why (from the "
             "server's log)")
    run = common.add_command(sub, "run", shows.split(";")[0], shows + ". Every variant at every size of the "
                             "profile by default: the plan it prints first says how many tokens that prefills (a real "
                             "model at 32K and 128K is hours on one GPU); --dry-run prints only the plan.")
    common.add_profile(run)
    run.add_argument("--variant", action="append", metavar="NAME", help="only this matrix variant (repeatable)")
    run.add_argument("--size", action="append", type=common.token_size,
                     help="prompt size in tokens: 2048, 32K or 1M (repeatable; default: the profile's sizes)")
    run.add_argument("--scenario", action="append", choices=scenarios.SCENARIO_IDS, metavar="ID",
                     help=f"only this scenario (repeatable; default: all of {', '.join(scenarios.SCENARIO_IDS)})")
    run.add_argument("--scenarios", dest="scenario", action=common.RenamedToRepeated, new="--scenario",
                     choices=scenarios.SCENARIO_IDS)  # the spelling before 2026-12-04
    run.add_argument("--corpus", help="corpus spec name in corpora/ or a path (default: the profile's `corpus:`, "
                     "else tiny-words for a tiny model, python-docs for any other)")
    run.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    common.add_wide(run)
    run.add_argument("--no-verify", action="store_true", help="skip the no-reuse reference comparison")
    run.add_argument("--dry-run", action="store_true", help="print the plan (sessions, requests, tokens, the "
                     "prefills the reuse model expects) and exit without starting a server")
    run.add_argument("--full-prefills", action="store_true", help="time every step to its end; by default a step "
                     "that would re-process more than 8K tokens and whose output nothing needs (the edit, the resend "
                     "after a restore on a hybrid) stops once its count is known, its seconds n/a")
    run.add_argument("--on-failure", type=session.OnFailure, choices=list(session.OnFailure),
                     default=session.OnFailure.STOP,
                     help="after a failed step: stop that session (default) or restart its server and go on; "
                          "the run goes on with the next session either way")
    run.add_argument("--repeat-first-load", type=int, metavar="N",
                     help="only the cold first load, N times per variant x size, each on a fresh server; "
                     "reports the spread with the GPU and page-cache state of each repeat")
    before = run.add_mutually_exclusive_group()
    before.add_argument("--idle-gap", type=float, metavar="SECONDS", help="with --repeat-first-load: idle this "
                        "long before each repeat (does the GPU cool down between loads?)")
    before.add_argument("--warm-up", action="store_true", help="with --repeat-first-load: prefill a short other "
                        "text on the same server before each measured load (recorded as a setup call)")
    common.add_json(run, "the measured steps as JSON on stdout instead of the tables (report.md is written too)")
    run.set_defaults(func=cmd_run)


def cmd_workload(args: argparse.Namespace) -> int:
    load = workload.load_workload(args.workload)
    profile = profiles.load_profile(args.profile or load.profile)
    named = args.variant or load.variant
    variant = profile.variant(named) if named else profile.variants[0]
    spec = resolve_for_workload(variant, build.of(variant.binary), load)
    stamp = provenance.of_launches(profile, [spec], RunKind.WORKLOAD, {
        "workload": load.name, "repeat": args.repeat, "free_running": args.free_running,
        "through_tap": args.through_tap})
    out = common.progress(args)
    started = time.monotonic()
    via = InFront(Path(args.results), long_prefill_tokens=load.long_prefill_tokens) if args.through_tap else None
    try:
        with open_run(Path(args.results), stamp) as (run, writer):
            print(f"run {run.run_id}: workload {load.name} on {profile.name} [{variant.name}], records -> "
                  f"{run.records_path}", file=out)
            for repeat in range(1, args.repeat + 1):
                if args.repeat > 1:
                    print(f"run {repeat} of {args.repeat}", file=out)
                service_run(load, spec, writer, run=run, free_running=args.free_running,
                            repeat=repeat if args.repeat > 1 else None, via=via, out=out).run()
    except Interrupted as stopped:
        return common.interrupted(stopped.summary)
    except ScheduleDeviation as exc:
        print(f"reusebench: workload {load.name}: the server left the serial schedule, so its counts would depend on "
              f"timing: {exc}; {len(records.read_records(run.records_path))} records kept in {run.records_path}",
              file=sys.stderr)
        return Exit.FINDING
    run_id, run_dir, records_path = run.run_id, run.path, run.records_path
    written = common.write_run_report(run_dir, f"workload {load.name}, run {run_id}")
    tapped = {path.name: common.write_run_report(path, f"tap, run {path.name}").text for path in via.runs} if via else {}
    if args.json:
        print(service_runs.figures_json(records.read_records(records_path)))
    else:
        print(written.text + "".join(f"\n\n## What the tap in front of it recorded ({name})\n\n{text}"
                                     for name, text in tapped.items()))
    print(f"\nworkload took {time.monotonic() - started:.0f} s; report: {run_dir / 'report.md'}; page: {written.page}",
          file=out)
    return Exit.OK


def _runs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of runs, 1 or more, got {text!r}")
    return int(text)


def add_workload(sub: common.Subparsers) -> None:
    shows = ("run a workload (workloads/): its users talk to one server, one request at a time in an order fixed by "
             "the file (or at once: --free-running); prints miss rates by class with the log's cause of each miss, "
             "what a long prefill costs the other users, and the health check's effect")
    load = common.add_command(sub, "workload", shows.split(";")[0], shows)
    load.add_argument("workload", help=f"workload name in workloads/ or a path ({', '.join(workload.workload_names())})")
    common.add_profile(load, required=False, what="another server profile than the workload's")
    load.add_argument("--variant", metavar="NAME", help="a variant of that profile (default: the workload's, else the first)")
    load.add_argument("--free-running", action="store_true", help="one thread per user on the wall clock instead "
                      "of the serial schedule: the server under the real scramble of threads, whose counts vary from "
                      "run to run")
    load.add_argument("--repeat", type=_runs, default=1, metavar="N", help="run the workload N times, each on a fresh "
                      "server, and report every figure's median, min and max (default 1)")
    load.add_argument("--through-tap", action="store_true", help="the users talk to the server through a tap "
                      "(`reusebench tap`), whose records go to a run of their own, reported after the workload's")
    load.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    common.add_json(load, "each run's figures as JSON on stdout instead of the tables (report.md is written too)")
    load.set_defaults(func=cmd_workload)
