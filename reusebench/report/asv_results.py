"""What asv stored per commit, and the suite's noise rule for comparing two commits (`reusebench compare`).

The rule, in one place: a count is exact (re-processed tokens, mismatches, missed turns,
verdict codes: the same build and inputs give the same count on every run), so any change
of one is real; a time moves with the machine, and the harness's own budget with where a
stopped step's last batch lands (2,048 or 4,096 tokens from run to run), so those count
as changed only beyond asv's own default factor, 10%, and beyond the spread the runs
measured themselves (repeated first loads: the ranges must part by the factor); a time
either run took on a busy machine (other work loading it: a step's time where its step was,
MachineBusy; any other time where any part of the run was, the replay's end included) is
not judged at all, only counted; the GPU, page-cache and load figures explain the others
and are never a regression themselves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

Key = tuple[str, tuple[str, ...]]  # (benchmark, parameter values as asv stores them)
NOISE_FACTOR = 1.10  # asv compare's default --factor
CONTEXT = ("gpu_state.FirstLoadGpuState.", "gpu_state.MachineBusy.", "gpu_state.FirstLoadSpread.",
           "replay.TraceReplayBusy.")  # explain the others; not results
BUSY = "gpu_state.MachineBusy.track_busy"  # params: size, variant, step
BUSY_FLAGS = (BUSY, "replay.TraceReplayBusy.track_busy")  # any of them set: the run met a busy machine
FIRST_LOAD_STEP = "'first_load/cold'"
# a time, and the min and max of its repeats where the run repeated it
SPREADS = {"reuse.FirstLoad.track_prefill_seconds": ("gpu_state.FirstLoadSpread.track_min_seconds",
                                                      "gpu_state.FirstLoadSpread.track_max_seconds")}
VERDICTS = "verdicts."
ACTIVE = 1.0  # verdict codes: 0 UNVERIFIED, 1 ACTIVE, 2 DISABLED, 3 INEFFECTIVE, 4 UNSAFE, 5 UNSUPPORTED


def stored(results_dir: Path, commit: str, machine: str | None = None) -> dict[Key, float | None]:
    """What asv stored for `commit` (a hash or its first 8 characters or more) on `machine` (default: any):
    {(benchmark, parameter values): figure}; None where a benchmark failed, NaN where it did not apply."""
    figures: dict[Key, float | None] = {}
    for path in results_dir.glob(f"{machine or '*'}/{commit[:8]}-*.json"):
        data = json.loads(path.read_text())
        if not data.get("commit_hash", "").startswith(commit):
            continue
        for name, row in data["results"].items():
            entry = dict(zip(data["result_columns"], row))
            combos: list[tuple[str, ...]] = [()]
            for values in entry["params"]:
                combos = [(*combo, value) for combo in combos for value in values]
            results = entry["result"] or [None] * len(combos)  # a benchmark that failed as a whole
            figures.update({(name, combo): value for combo, value in zip(combos, results)})
    return figures


def is_noisy(benchmark: str) -> bool:
    """A time, or the harness's own cost: compared with the factor, not exactly."""
    return benchmark.startswith("harness.") or benchmark.endswith(("_seconds", "_ms"))


@dataclass(frozen=True)
class Change:
    key: Key
    before: float | None
    after: float | None
    kind: str  # "regression", "improvement" or "changed"

    def row(self) -> list[str]:
        name, params = self.key
        ratio = (f"{self.after / self.before:.2f}" if self.before and self.after is not None and
                 not math.isnan(self.before) and not math.isnan(self.after) else "")
        return [self.kind, name, ", ".join(p.strip("'") for p in params), _cell(self.before), _cell(self.after), ratio]


def compare(before: dict[Key, float | None], after: dict[Key, float | None]) -> list[Change]:
    """Every figure the rule counts as changed, regressions first (asv's convention: lower is better); a time the
    rule does not judge (a busy machine) comes last, as "busy"."""
    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, math.nan), after.get(key, math.nan)
        if is_noisy(key[0]) and (_busy(before, key) or _busy(after, key)):
            changes += [Change(key, old, new, "busy")] if old != new and _known(old) and _known(new) else []
        elif (change := _judge(key, old, new, _parted(before, after, key))) is not None:
            changes.append(change)
    order = {"regression": 0, "improvement": 1, "changed": 2, "busy": 3}
    return sorted(changes, key=lambda c: order[c.kind])


def count_changes(before: dict[Key, float | None], after: dict[Key, float | None]) -> list[Change]:
    """The changes of counts alone (what a bisect can find): no time, no context, no failure on either side."""
    return [c for c in compare(before, after)
            if c.kind != "busy" and not is_noisy(c.key[0]) and c.before is not None and c.after is not None]


def missing_counts(*commits: dict[Key, float | None]) -> list[Key]:
    """The counts any of `commits` (their figures as `stored` reads them) has no figure for: its benchmark failed,
    or asv stored none for it. Between two commits, whether such a count changed cannot be said."""
    counts = {key for figures in commits for key in figures
              if not key[0].startswith(CONTEXT) and not is_noisy(key[0])}
    return sorted(key for key in counts if any(figures.get(key) is None for figures in commits))


def _known(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _busy(figures: dict[Key, float | None], key: Key) -> bool:
    """Whether the run took this time on a busy machine: a step's time where its step was, any other time (the
    harness's, the replay's, the workloads') where any part of the run was (unknown in older results: not busy)."""
    name, params = key
    if name.startswith(("reuse.FirstLoad.", "reuse.StepSeconds.")):
        step = params[2] if len(params) > 2 else FIRST_LOAD_STEP
        return figures.get((BUSY, (*params[:2], step))) == 1.0
    return any(flag in BUSY_FLAGS and value == 1.0 for (flag, _), value in figures.items())


def _parted(before: dict[Key, float | None], after: dict[Key, float | None], key: Key) -> bool:
    """False where both runs measured a spread for this time and the ranges overlap within the factor."""
    spread = SPREADS.get(key[0])
    if spread is None:
        return True
    found = [f.get((name, key[1])) for name in spread for f in (before, after)]
    values = [v for v in found if v is not None and not math.isnan(v)]
    if len(values) < len(found):
        return True
    old_low, new_low, old_high, new_high = values
    return new_low > old_high * NOISE_FACTOR or old_low > new_high * NOISE_FACTOR


def _judge(key: Key, old: float | None, new: float | None, parted: bool = True) -> Change | None:
    name = key[0]
    if name.startswith(CONTEXT):
        return None
    if old is None or new is None:  # a benchmark that failed on one side only
        return None if old is new else Change(key, old, new, "regression" if new is None else "improvement")
    if math.isnan(old) or math.isnan(new):  # n/a on one side: a step or variant that applies to one build only
        return None if math.isnan(old) and math.isnan(new) else Change(key, old, new, "changed")
    if name.startswith(VERDICTS):
        if new == old:
            return None
        return Change(key, old, new, "improvement" if new == ACTIVE else "regression" if new > ACTIVE else "changed")
    if is_noisy(name):
        if not parted:
            return None
        if old > 0 and new > old * NOISE_FACTOR:
            return Change(key, old, new, "regression")
        if new > 0 and old > new * NOISE_FACTOR:
            return Change(key, old, new, "improvement")
        return None
    if new == old:
        return None
    return Change(key, old, new, "regression" if new > old else "improvement")


def render(changes: list[Change], before: str, after: str) -> str:
    if not changes:
        return f"{before[:12]} -> {after[:12]}: no figure changed beyond the noise rule"
    judged = [c for c in changes if c.kind != "busy"]
    busy = len(changes) - len(judged)
    regressions = sum(c.kind == "regression" for c in changes)
    lines = [tabulate([c.row() for c in judged], headers=["", "benchmark", "parameters", before[:12], after[:12],
                                                          "ratio"], tablefmt="github")] if judged else []
    if busy:
        lines.append(f"{busy} time(s) not judged: other work loaded the machine while they were taken (load average "
                     "above one task per core plus 0.5: gpu_state.MachineBusy, replay.TraceReplayBusy)")
    lines.append(f"{before[:12]} -> {after[:12]}: {regressions} regression(s), {len(judged)} change(s)")
    return "\n\n".join(lines)


def _cell(value: float | None) -> str:
    if value is None:
        return "failed"
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if value == round(value) or abs(value) >= 100 else f"{value:.3g}"
