"""One build's figures: a profile's run on that build's llama-server, its counts per variant, size and step.

Counts decide a bisect (the same build and inputs give the same count on any machine, loaded or not); a step
that does not apply to a build, or a variant its llama-server cannot run, is n/a (None), which is a figure too:
the first build that takes an option is a change. A build that fails to build or to run is not a figure: the
search skips it, as `git bisect skip` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TextIO

from reusebench import records
from reusebench.bisect.builds import Builds, Point
from reusebench.config import profiles, scenarios, sizes
from reusebench.llama import binaries, builder
from reusebench.run import runner
from reusebench.run.selection import Selection

# what a bisect can judge, per step: tokens re-processed, measured minus the reuse model's expected, and whether
# the reused output differed from output without reuse (1) or not (0)
KINDS = ("tokens", "deviation", "mismatch")


class FigureKey(NamedTuple):
    variant: str
    size: str  # "8K"
    step: str  # "scenario/step", as asv names it
    kind: str  # one of KINDS

    def __str__(self) -> str:
        return f"{self.step} {self.kind} ({self.variant} @ {self.size})"


@dataclass(frozen=True)
class Probe:
    """What every build runs, resolved once: the profile (its binary replaced by each build's), its variants
    (None: all), sizes and scenarios, with or without output verification, and where records go."""

    profile: str | Path
    variants: tuple[str, ...] | None
    sizes: tuple[int, ...]
    scenarios: tuple[str, ...]
    verify: bool
    results: Path


@dataclass(frozen=True)
class Measurement:
    figures: dict[FigureKey, int | None]
    not_applicable: dict[str, str] = field(default_factory=dict)  # variant -> why this build cannot run it
    failed: str | None = None  # why no figure can be taken (a failed build or session): skip this build
    run: str | None = None  # the run directory of its records


def measure_build(builds: Builds, point: Point, probe: Probe, out: TextIO) -> Measurement:
    """Build `point` (cached) and run `probe` on it; a tree that does not build or run is skipped, as `git bisect
    skip` would."""
    print(f"bisect: measuring {point.name}", file=out, flush=True)
    try:
        binary = builds.binary(point, lambda message: print(message, file=out, flush=True))
    except builder.BuildError as exc:
        return Measurement({}, failed=f"does not build: {str(exc).splitlines()[0]}")
    try:
        return measure(probe, binary, out)
    except binaries.BinaryError as exc:  # built, but its llama-server does not run (its --help fails)
        return Measurement({}, failed=f"does not run: {str(exc).splitlines()[0]}")


def measure(probe: Probe, binary: Path, out: TextIO) -> Measurement:
    """Run `probe` on `binary`: every figure it gives, n/a for the variants this build cannot run."""
    loaded = profiles.load_for_build(probe.profile, probe.variants, binary=binary)
    figures: dict[FigureKey, int | None] = {}
    for variant in loaded.skipped:  # every step n/a, so that a build that starts taking the variant is a change
        figures.update(dict.fromkeys(_keys(variant, probe), None))
    if not loaded.runnable:
        return Measurement(figures, loaded.skipped)
    selection = Selection(tuple(loaded.runnable), probe.sizes, probe.scenarios, verify=probe.verify)
    result = runner.run_profile(loaded.profile, selection, results_dir=probe.results, out=out)
    if result.failed_sessions:
        return Measurement({}, loaded.skipped, failed=f"{result.failed_sessions} session(s) failed; records: "
                           f"{result.run_dir}", run=str(result.run_dir))
    for variant in loaded.runnable:
        figures.update(dict.fromkeys(_keys(variant, probe), None))  # a step the run did not reach: n/a
    figures.update(of_records(result.records))
    return Measurement(figures, loaded.skipped, run=str(result.run_dir))


def of_records(measured: Iterable[records.Record]) -> dict[FigureKey, int | None]:
    """Each measured step's figures; with repeats, the last (counts are the same on every repeat)."""
    figures: dict[FigureKey, int | None] = {}
    for r in measured:
        if r.role != records.Role.MEASURE or r.error:
            continue
        where = (r.variant, sizes.size_label(r.size), f"{r.scenario}/{r.step}")
        figures[FigureKey(*where, "tokens")] = r.prompt_n
        figures[FigureKey(*where, "deviation")] = records.deviation(r)
        figures[FigureKey(*where, "mismatch")] = None if r.matches_reference is None else int(not r.matches_reference)
    return figures


def _keys(variant: str, probe: Probe) -> list[FigureKey]:
    steps = [step for step in scenarios.MEASURED_STEPS if step.split("/")[0] in probe.scenarios]
    return [FigureKey(variant, sizes.size_label(size), step, kind)
            for size in probe.sizes for step in steps for kind in KINDS]
