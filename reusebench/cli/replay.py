"""`reusebench replay` (a production trace against llama-server) and the trace options `whatif` shares."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tabulate import tabulate

from reusebench import records
from reusebench.capability import build
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import profiles
from reusebench.config.profiles import Variant
from reusebench.records import RunKind
from reusebench.report import replay_report
from reusebench.run import provenance
from reusebench.run.opening import Interrupted, open_run
from reusebench.run.replay import Replay, ReplayMode, ScheduleDeviation, resolve_for_trace
from reusebench.trace import mooncake
from reusebench.trace.mooncake import Trace, TraceSelection
from reusebench.trace.prompts import BlockIds, trace_prompts, vocabulary

# The paper's Table 2 (Mooncake, FAST'25): (requests, mean input, mean output, cache ratio)
PAPER_TABLE_2 = {"Conversation": (12_031, 12_035, 343, 0.40), "Tool&Agent": (23_608, 8_596, 182, 0.59),
                 "Synthetic": (3_993, 15_325, 149, 0.66)}


def request_slice(text: str) -> tuple[int, int | None]:
    """An argparse type: START:STOP of the trace's requests, 0-based, STOP excluded (either may be left out)."""
    start, colon, stop = text.partition(":")
    if not colon or not all(part.strip().isdigit() for part in (start, stop) if part.strip()):
        raise argparse.ArgumentTypeError(f"expected START:STOP (request numbers from 0, e.g. 0:300), got {text!r}")
    return int(start or 0), int(stop) if stop.strip() else None


def add_trace(parser: argparse.ArgumentParser) -> None:
    """The trace and which of its requests, as `replay` and `whatif` take them."""
    parser.add_argument("trace", help="a Mooncake-format trace (JSONL, or .jsonl.gz) or a shipped one by name ("
                        f"{', '.join(mooncake.trace_names())}); `tap --trace` writes one")
    parser.add_argument("--scale", type=common.positive_int, default=1, metavar="N",
                        help="divide lengths and the 512-token block by N, a divisor of 512 (16 on a CPU: 32-token "
                        "blocks, about 750 tokens a request)")
    parser.add_argument("--slice", type=request_slice, default=(0, None), metavar="START:STOP",
                        help="only requests START to STOP-1 of the file (from 0)")
    parser.add_argument("--limit", type=common.positive_int, metavar="N", help="only the first N requests (after "
                        "--slice)")


def selection(args: argparse.Namespace) -> TraceSelection:
    start, stop = args.slice
    return TraceSelection(args.trace, args.scale, start, stop, args.limit)


def variant_of(args: argparse.Namespace) -> Variant:
    profile = profiles.load_profile(args.profile)
    return profile.variant(args.variant) if args.variant else profile.variants[0]


def trace_selection(whole: Trace, trace: Trace, mode: str) -> dict[str, object]:
    """What a replay's run.json says it replayed: the trace by name, its cut and scale, the mode."""
    return {"trace": whole.name, "requests": len(trace.requests), "scale": trace.scale,
            "block_tokens": trace.block_tokens, "mode": mode}


def blocks_for(variant: Variant, trace: Trace) -> BlockIds:
    return BlockIds(vocabulary(variant.model), trace.block_tokens)


def stats_line(whole: Trace) -> str:
    found = mooncake.stats(whole)
    return (f"{found.requests:,} requests, mean input {found.mean_input:,.0f} and output {found.mean_output:,.0f} "
            f"tokens, cache ratio {100 * found.cache_ratio:.1f}% (an unbounded prefix cache in file order; "
            "`replay --stats` sets it beside the paper's)")


def render_stats(whole: Trace) -> str:
    found = mooncake.stats(whole)
    rows = [[f"{whole.name} (this file)", f"{found.requests:,}", f"{found.mean_input:,.0f}", f"{found.mean_output:,.0f}",
             f"{100 * found.cache_ratio:.1f}%"]]
    rows += [[f"paper, Table 2: {name}", f"{n:,}", f"{i:,}", f"{o:,}", f"{100 * r:.0f}%"]
             for name, (n, i, o, r) in PAPER_TABLE_2.items()]
    return (tabulate(rows, headers=["trace", "requests", "mean input", "mean output", "cache ratio"],
                     tablefmt="github") + f"\n\n{mooncake.STATS_DEFINITION}; the paper does not define its own.")


def cmd_replay(args: argparse.Namespace) -> int:
    whole, trace = selection(args).load()
    if args.stats:
        print(render_stats(whole))
        return Exit.OK
    if args.profile is None:
        raise ValueError("--profile is needed to replay (only --stats reads the trace alone)")
    profile = profiles.load_profile(args.profile)
    variant = profile.variant(args.variant) if args.variant else profile.variants[0]
    blocks = blocks_for(variant, trace)
    spec = resolve_for_trace(variant, build.of(variant.binary), trace)
    prompts = trace_prompts(trace, blocks)
    mode = ReplayMode(timed=args.timed, speed=args.speed)
    stamp = provenance.of_launches(profile, [spec], RunKind.REPLAY, trace_selection(whole, trace, mode.name))
    out = common.progress(args)
    started = time.monotonic()
    try:
        with open_run(Path(args.results), stamp) as (run, writer):
            print(f"run {run.run_id}: {len(prompts)} requests of {whole.name} at 1/{trace.scale} ({trace.block_tokens}"
                  f"-token blocks) on {variant.profile} [{variant.name}], {mode.name}; records -> {run.records_path}",
                  file=out)
            print(f"the whole file: {stats_line(whole)}", file=out)
            Replay(prompts, blocks, spec, writer, run=run, trace_name=whole.name, mode=mode, out=out).run()
    except Interrupted as stopped:
        return common.interrupted(stopped.summary)
    except ScheduleDeviation as exc:
        print(f"reusebench replay: the server left the serial order, so its counts would depend on timing: {exc}; "
              f"records kept in {run.records_path}", file=sys.stderr)
        return Exit.FINDING
    written = common.write_run_report(run.path, f"replay of {whole.name}, run {run.run_id}")
    found = replay_report.figures(records.read_records(run.records_path))
    print(json.dumps([f.as_dict() for f in found], indent=2) if args.json else written.text)
    print(f"\nreplay took {time.monotonic() - started:.0f} s; report: {run.path / 'report.md'}; page: {written.page}",
          file=out)
    differs = not mode.timed and any(f.differ or f.not_forced for f in found)
    return Exit.FINDING if differs or any(f.failed for f in found) else Exit.OK


def add_replay(sub: common.Subparsers) -> None:
    shows = ("replay a production trace (Mooncake's format) against a profile's server: per request the tokens "
             "re-processed beside the trace's own ideal and the reuse model's expected count, the misses by where "
             "the request was served from, and the prefill seconds they cost")
    replay = common.add_command(sub, "replay", shows.split(":")[0], shows + ". Prompts are token ids with exactly "
                                "the trace's prefix sharing (one fixed block of the model's tokens per hash id); "
                                "serially (default) every measured count must equal the expected one.")
    add_trace(replay)
    common.add_profile(replay, required=False)
    replay.add_argument("--variant", metavar="NAME", help="a variant of that profile (default: the first)")
    replay.add_argument("--timed", action="store_true", help="send each request at its arrival time, as many in "
                        "flight as the trace has (default: one at a time, in trace order)")
    replay.add_argument("--speed", type=common.positive_float, default=1.0, metavar="X",
                        help="with --timed: arrival times divided by X (default 1)")
    replay.add_argument("--stats", action="store_true", help="only the whole file's statistics beside the paper's "
                        "Table 2, with no server")
    replay.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    common.add_json(replay, "each replayed session's figures as JSON on stdout (report.md is written too)")
    replay.set_defaults(func=cmd_replay)
