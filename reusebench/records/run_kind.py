"""What a run is: the kind its run.json names, which reports and pages choose by."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from reusebench.records.schema import Record


class RunKind(StrEnum):
    SCENARIOS = "scenarios"  # `run`: a profile's scenario sessions
    WORKLOAD = "workload"  # `workload`: users on one server
    REPLAY = "replay"  # `replay`: a trace's requests (also the scenario its records name)
    WHATIF = "whatif"  # `whatif --verify`: replays of the ranked launches
    TAP = "tap"  # `tap`: real clients, recorded in passing (also the scenario its records name)
    CHECK = "check"  # `check`: option verdicts, no records


def guessed(records: Iterable[Record]) -> RunKind:
    """The kind of a run from before run.json named it, from its records: a replay's and a tap's name their
    scenario, a workload's name their users."""
    rs = list(records)
    for kind in (RunKind.REPLAY, RunKind.TAP):
        if any(r.scenario == kind for r in rs):
            return kind
    return RunKind.WORKLOAD if any(r.user is not None for r in rs) else RunKind.SCENARIOS
