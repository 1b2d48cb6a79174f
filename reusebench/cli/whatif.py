"""`reusebench whatif`: what each launch option would win on a trace, predicted with no server, then (--verify K)
replayed for real."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

from reusebench import records
from reusebench.capability import build
from reusebench.cli import common
from reusebench.cli import replay as replay_cli
from reusebench.cli.exits import Exit
from reusebench.config import profiles
from reusebench.records import RunKind
from reusebench.report import replay_report, run_kinds, view, whatif_report
from reusebench.run import provenance
from reusebench.run.opening import Interrupted, open_run, stamped_run
from reusebench.run.recording import RunDir
from reusebench.run.replay import Replay, ReplayMode
from reusebench.trace.mooncake import Trace
from reusebench.trace.prompts import BlockIds, TracePrompt, trace_prompts
from reusebench.whatif import combinations as combos
from reusebench.whatif.prediction import Outcome, predict_combinations
from reusebench.whatif.rate import PrefillRate, from_records, last_replay

RATE_REQUESTS = 16  # the short replay that measures a prefill rate when no earlier one is there


def tried(text: str) -> combos.Tried:
    """An argparse type: OPTION=V1,V2."""
    try:
        return combos.parse_try(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"--try {text}: ")) from None


def _replay(outcomes: list[Outcome], prompts: list[TracePrompt], blocks: BlockIds, trace: Trace,
            args: argparse.Namespace, why: str, prediction: str | None = None) -> tuple[RunDir, list[records.Record]]:
    """A serial replay of each outcome's launch, all in one new run; (the run, its records). Its run.json names
    why, and the prediction's run it verifies. Ctrl-C stops it with every server stopped and what was recorded
    kept."""
    profile = profiles.load_profile(args.profile)
    stamp = provenance.of_launches(profile, [o.spec for o in outcomes], RunKind.REPLAY, {
        **replay_cli.trace_selection(trace, trace, ReplayMode().name), "for": why,
        **({"prediction": prediction} if prediction else {})})
    with open_run(Path(args.results), stamp) as (run, writer):
        print(f"{why}: {len(outcomes)} launch(es), a serial replay of {len(prompts)} requests each (run "
              f"{run.run_id})", file=common.progress(args))
        for o in outcomes:
            Replay(prompts, blocks, o.spec, writer, run=run, trace_name=trace.name, mode=ReplayMode(),
                   out=common.progress(args)).run()
    return run, records.read_records(run.records_path)


def _rate(args: argparse.Namespace, as_it_is: Outcome, prompts: list[TracePrompt], blocks: BlockIds,
          trace: Trace) -> PrefillRate:
    variant = as_it_is.spec.variant
    if args.rate is not None:
        return PrefillRate(int(args.rate * 1000), 1000.0, "given: --rate")
    found = last_replay(Path(args.results), variant.profile, variant.name)
    if found is not None:
        return found
    short = prompts[:RATE_REQUESTS]
    run, _ = _replay([as_it_is], short, blocks, trace, args, f"no replay of {variant.profile} [{variant.name}] "
                     f"under {args.results}: measuring the prefill rate")
    common.write_run_report(run.path, f"replay of {trace.name} for a prefill rate, run {run.run_id}")
    measured = from_records(run.records_path, variant.profile, variant.name)
    if measured is None:
        raise ValueError(f"the short replay in {run.path} measured no prefill")
    return PrefillRate(measured.tokens, measured.seconds, f"measured now: {measured.source}, {len(short)} requests")


def _verify(best: list[Outcome], prompts: list[TracePrompt], blocks: BlockIds, trace: Trace, rate: PrefillRate,
            args: argparse.Namespace, prediction: RunDir, link: Callable[[RunDir], None]) -> int:
    """Replays `best` serially and prints, per launch, the re-processed tokens and prefill seconds predicted (at
    `rate`) beside the measured ones; exit 1 where a count differs. The prediction's page links to the
    verification once it ran (`link`)."""
    try:
        print(file=common.progress(args))
        run, measured = _replay(best, prompts, blocks, trace, args, "verifying the prediction", prediction.run_id)
    except Interrupted as stopped:
        return common.interrupted(stopped.summary)
    link(run)
    written = common.write_run_report(run.path, f"whatif verification on {trace.name}, run {run.run_id}")
    by_session = {f.session: f for f in replay_report.figures(measured)}
    table, differ = [], False
    for o in best:
        assert o.prediction is not None
        session = next((f for name, f in by_session.items() if name.endswith(f"/{o.spec.variant.name}")), None)
        got = None if session is None else session.measured
        first = "" if session is None or not session.differ else (
            f"request {session.differ[0].turn}: predicted {session.differ[0].expected:,}, "
            f"measured {session.differ[0].prompt_n:,}")
        same = got == o.prediction.reprocessed and not first
        differ |= not same
        table.append([o.combination.label, f"{o.prediction.reprocessed:,}", "-" if got is None else f"{got:,}",
                      "equal" if same else "DIFFERS", f"{rate.seconds_for(o.prediction.reprocessed):,.1f}",
                      "-" if session is None else f"{session.prefill_s:,.1f}", first])
    headers = ["launch", "predicted", "measured", "", "predicted s", "measured s", "first difference"]
    narrow = None if args.wide else [whatif_report.LAUNCH_WIDTH, None, None, None, None, None, 24]
    print(tabulate(table, headers=headers, tablefmt="simple", disable_numparse=True, maxcolwidths=narrow))
    print(f"(tokens decide; the seconds are this box's: predicted at {rate.describe()})")
    print(f"\npage: {written.page}", file=common.progress(args))
    return Exit.FINDING if differ else Exit.OK


def cmd_whatif(args: argparse.Namespace) -> int:
    whole, trace = replay_cli.selection(args).load()
    variant = replay_cli.variant_of(args)
    server_build = build.of(variant.binary)  # the rules, --help and memory every combination shares
    found = combos.combinations(variant, server_build.help, args.try_ or [])
    blocks = replay_cli.blocks_for(variant, trace)
    prompts = trace_prompts(trace, blocks)
    started = time.monotonic()
    outcomes = predict_combinations(found, trace, prompts, blocks, server_build)
    took = time.monotonic() - started
    trace_line = (f"{len(prompts):,} requests of {whole.name} at 1/{trace.scale} on {variant.profile} [{variant.name}]: "
                  f"{len(found)} launches predicted in {took:.1f} s, serially in trace order")
    as_it_is = outcomes[0]
    rate = _rate(args, as_it_is, prompts, blocks, trace)
    stamp = provenance.of_launches(profiles.load_profile(args.profile), [o.spec for o in outcomes], RunKind.WHATIF,
                                   replay_cli.trace_selection(whole, trace, "predicted"))
    run = stamped_run(Path(args.results), stamp)  # predicted with no server: nothing recorded, whatif.json ranks
    (run.path / run_kinds.WHATIF_FILE).write_text(whatif_report.render_json(outcomes, rate, trace={
        "name": whole.name, "requests": len(prompts), "scale": trace.scale}))
    page = run.path / view.PAGE

    def write_page(verification: RunDir | None = None) -> None:
        page.write_text(whatif_report.render_page(outcomes, rate, title=f"reusebench whatif {run.run_id}",
                                                  trace_line=trace_line, verification=verification))
        view.write_index(Path(args.results))

    write_page()
    if args.json:
        print((run.path / run_kinds.WHATIF_FILE).read_text())
    else:
        print(whatif_report.render_text(outcomes, rate, trace_line=trace_line,
                                        width=None if args.wide else common.TERMINAL_COLUMNS))
    print(f"\npage: {page}", file=common.progress(args))
    if not args.verify:
        return Exit.OK
    return _verify(distinct_launches(as_it_is, whatif_report.ranked(outcomes), args.verify), prompts, blocks, trace,
                   rate, args, run, write_page)


def distinct_launches(as_it_is: Outcome, ranked: list[Outcome], count: int) -> list[Outcome]:
    """The launch as it is (where predicted) and the best `count` others, each launch line once: a combination
    that sets what the profile already sets launches the same server, and is replayed once."""
    chosen = [as_it_is] if as_it_is.prediction else []
    seen = {tuple(o.spec.args) for o in chosen}
    for o in ranked:
        if len(chosen) - bool(as_it_is.prediction) == count:
            break
        if o.combination.setting and tuple(o.spec.args) not in seen:
            seen.add(tuple(o.spec.args))
            chosen.append(o)
    return chosen


def add_whatif(sub: common.Subparsers) -> None:
    shows = ("predict, with no server, what each combination of launch options would re-process on a trace and "
             "what it would cost in prefill seconds on this box; --verify K replays the best K for real")
    whatif = common.add_command(sub, "whatif", shows.split(";")[0], shows + ". The reuse model follows the build's "
                                "rules (slots, similarity, the RAM cache, checkpoints), so serially a replay must "
                                "measure what it predicts.")
    replay_cli.add_trace(whatif)
    common.add_profile(whatif)
    whatif.add_argument("--variant", metavar="NAME", help="a variant of that profile (default: the first)")
    whatif.add_argument("--try", dest="try_", action="append", type=tried, metavar="OPTION=V1,V2",
                        help=f"a launch option and its values to try (repeatable; every combination is predicted): "
                        f"{', '.join(combos.TRIABLE)}")
    whatif.add_argument("--verify", type=common.positive_int, metavar="K", help="replay the best K combinations and "
                        "the profile as it is, serially, and print predicted beside measured")
    whatif.add_argument("--rate", type=common.positive_float, metavar="TOKENS_PER_S", help="the prefill rate for the "
                        "seconds (default: from the last replay of this variant under --results, else a short replay "
                        "now)")
    whatif.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    common.add_wide(whatif)
    common.add_json(whatif, "the ranked combinations as JSON on stdout")
    whatif.set_defaults(func=cmd_whatif)
