"""What a run measures of a profile, as the command line (or asv, or advise) chose it: ``Selection``.

Chosen once and passed down whole: ``runner.run_profile`` and ``runner.plan_profile`` take one, so a plan and the
run it announces read the same choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from reusebench.config import profiles, scenarios
from reusebench.run.session import OnFailure


@dataclass(frozen=True)
class Repeats:
    """``--repeat-first-load``: `count` cold first loads per variant x size, each on a fresh server.

    A fresh server loads the model every time, so page-cache and GPU state show in the figures.
    `idle_gap_s` idles before each repeat (to see a GPU cool down); `warm_up` instead prefills
    another text on the same server before the measured load, recorded as a setup call.
    """

    count: int
    idle_gap_s: float = 0.0
    warm_up: bool = False

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"--repeat-first-load needs at least 1 repeat, got {self.count}")
        if self.idle_gap_s < 0:
            raise ValueError(f"--idle-gap must not be negative, got {self.idle_gap_s:g}")
        if self.warm_up and self.idle_gap_s:
            raise ValueError("--idle-gap and --warm-up contradict each other: idle to cool down, or warm up")


@dataclass(frozen=True)
class Selection:
    """Which variants, sizes and scenarios run (empty: all the profile names), and how.

    `verify`: reused outputs are compared with no-reuse references. `early_stop`: a step the scenario lets stop
    ends once its count is known (``plan.stops_at``); False times every step to its end. `repeats`: only repeated
    first loads run (then `scenario_ids` must be empty). `on_failure`: a session whose step failed stops, or
    restarts its server and goes on; the run goes on with the next session either way.
    """

    variants: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    scenario_ids: tuple[str, ...] = ()
    corpus_name: str | None = None
    verify: bool = True
    early_stop: bool = True
    repeats: Repeats | None = None
    on_failure: OnFailure = OnFailure.STOP

    def __post_init__(self) -> None:
        if self.repeats is not None and self.scenario_ids:
            raise ValueError("repeated first loads run first_load only: leave out the scenario selection")


ALL = Selection()  # everything the profile names, verified, steps stopped at their counts

Chosen = tuple[profiles.Variant, int, list[scenarios.Scenario]]  # one session as the selection chose it


def sessions(profile: profiles.Profile, selection: Selection) -> list[Chosen]:
    """The run's sessions in order, each with the scenarios it runs (one per repeat: first_load)."""
    chosen = [profile.variant(v) for v in selection.variants] if selection.variants else list(profile.variants)
    if not selection.sizes and not all(variant.sizes for variant in chosen):
        raise ValueError(f"{profile.path}: sizes: the profile (and every profile it extends) names none: "
                         "give the sizes to run, e.g. --size 32K")
    selected = {variant.name: scenarios.select(selection.scenario_ids or variant.scenarios) for variant in chosen}
    return [(variant, size, selected[variant.name]) for variant in chosen for size in selection.sizes or variant.sizes]

