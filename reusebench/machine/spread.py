"""Spread of repeated first loads, with the machine state of each repeat beside it.

Report A saw one 128K first load take 17.6, 21.5 and 24.2 minutes and could only
guess why. Each repeat here carries the GPU state at its start and during it and
whether the model file was in the page cache, and the warnings say, as hyperfine
does, when the first repeat stands apart, when a repeat is an outlier, and when
throttling or a cold page cache coincides with the slow ones.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tabulate import tabulate

from reusebench.records import Record, Role

FIRST_RUN_FACTOR = 1.15  # the first repeat is flagged when it is 15% off the median of the rest
OUTLIER_MADS = 3.0  # robust outliers: beyond 3 median absolute deviations from the median ...
# ... and 15% off it: with few, nearly equal repeats the MAD is tiny and a 0.02 s wobble is not an outlier.
OUTLIER_FACTOR = FIRST_RUN_FACTOR


@dataclass(frozen=True)
class Spread:
    seconds: tuple[float, ...]
    minimum: float
    median: float
    maximum: float
    warnings: tuple[str, ...]

    @property
    def relative(self) -> float:
        return (self.maximum - self.minimum) / self.minimum if self.minimum else 0.0


def _seconds(r: Record) -> float:
    return (r.prompt_ms or 0.0) / 1000.0


def _number(index: int, r: Record) -> int:
    return r.extra.get("repeat", index + 1)


def _gpu(r: Record, key: str) -> float | str | None:
    return (r.gpu or {}).get(key)


def _page_cache(r: Record) -> float | None:
    return (r.host or {}).get("model_page_cache_fraction")


def spread(repeats: Sequence[Record]) -> Spread:
    """Min/median/max of first-load prefill seconds and the warnings they call for."""
    if not repeats:
        raise ValueError("no first-load repeats to summarise")
    seconds = [_seconds(r) for r in repeats]
    numbers = [_number(i, r) for i, r in enumerate(repeats)]  # as recorded: a failed repeat leaves a gap
    median = statistics.median(seconds)
    warnings: list[str] = []
    if len(seconds) >= 3:
        warnings += _first_repeat_apart(seconds)
        mad = statistics.median(abs(s - median) for s in seconds)
        outliers = [numbers[i] for i, s in enumerate(seconds)
                    if mad and abs(s - median) > max(OUTLIER_MADS * mad, (OUTLIER_FACTOR - 1) * median)]
        if outliers:
            warnings.append(f"statistical outliers: repeat(s) {', '.join(map(str, outliers))}; "
                            "other programs or power management may have interfered")
    slow = {numbers[i] for i, s in enumerate(seconds) if s > median}
    throttled = {numbers[i] for i, r in enumerate(repeats) if float(_gpu(r, "throttled_fraction") or 0) > 0}
    if throttled and throttled <= slow:
        warnings.append(f"throttling coincides with the slow repeat(s) {', '.join(map(str, sorted(throttled)))}")
    cold_disk = [numbers[i] for i, r in enumerate(repeats) if (fraction := _page_cache(r)) is not None and fraction < 0.5]
    if cold_disk:
        warnings.append(f"the model file was mostly not in the page cache before repeat(s) "
                        f"{', '.join(map(str, cold_disk))} (cold disk)")
    return Spread(tuple(seconds), min(seconds), median, max(seconds), tuple(warnings))


def _first_repeat_apart(seconds: Sequence[float]) -> list[str]:
    """A warning when the first repeat lies outside the range of the rest and 15% off their median.

    Slower first: caches or clocks were cold. Faster first (report A's fastest load came after 10 h
    of standby): it ran on a rested machine and the later ones on a heat-soaked one.
    """
    first, rest = seconds[0], seconds[1:]
    typical = statistics.median(rest)
    if not typical or min(rest) <= first <= max(rest) or 1 / FIRST_RUN_FACTOR <= first / typical <= FIRST_RUN_FACTOR:
        return []
    why = ("caches or clocks were cold (compare its page-cache and GPU state); consider --warm-up" if first > typical
           else "it ran on a rested machine, the rest on a heat-soaked one (compare start temperatures and idle "
           "times); consider --idle-gap")
    return [f"the first repeat took {first:.2f} s against {typical:.2f} s for the rest: {why}"]


def _fmt(value: float | str | None, spec: str) -> str:
    return "-" if value is None else (value if isinstance(value, str) else format(value, spec))


STATE_COLUMNS = ("prefill s", "start temp C", "mean SM MHz", "throttled", "idle before s", "warm/cold",
                 "model in page cache")


def state_cells(r: Record) -> list[str]:
    """One repeat's seconds and machine state, in STATE_COLUMNS order; "-" where unknown (no GPU)."""
    return [f"{_seconds(r):.2f}", _fmt(_gpu(r, "start_temperature_c"), ".0f"), _fmt(_gpu(r, "sm_clock_mean_mhz"), ".0f"),
            _fmt(_gpu(r, "throttled_fraction"), ".2f"), _fmt(_gpu(r, "idle_before_s"), ".0f"), _fmt(_gpu(r, "warmth"), ""),
            _fmt(_page_cache(r), ".2f")]


def session_first_load(session: Sequence[Record]) -> Record | None:
    """The measured first load of one session's records, with the page-cache state from before its server started.

    After a warm-up the measured call is not the session's first, and only the first call
    carries the state captured before the model was mapped: the measured record borrows it.
    """
    measured = next((r for r in session if r.role == Role.MEASURE and r.scenario == "first_load" and not r.error), None)
    if measured is None or _page_cache(measured) is not None:
        return measured
    return dataclasses.replace(measured, host={**(measured.host or {}), "model_page_cache_fraction": _page_cache(session[0])})


def first_load_repeats(records: Iterable[Record]) -> dict[tuple[str, str, str, int], list[Record]]:
    """Measured first loads of repeated sessions by (run, profile, variant, size), in repeat order."""
    sessions: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        if r.extra.get("repeat") is not None:
            sessions[(r.run_id, r.session)].append(r)
    groups: dict[tuple[str, str, str, int], list[Record]] = defaultdict(list)
    for session in sessions.values():
        measured = session_first_load(session)
        if measured is not None:
            groups[(measured.run_id, measured.profile, measured.variant, measured.size)].append(measured)
    return {key: sorted(rs, key=lambda r: r.extra["repeat"]) for key, rs in groups.items()}


def render(repeats: Sequence[Record]) -> str:
    """Each repeat's seconds beside its start temperature, mean SM clock, throttling and page-cache state."""
    result = spread(repeats)
    rows = [[str(_number(i, r)), *state_cells(r)] for i, r in enumerate(repeats)]
    lines = [
        tabulate(rows, ["repeat", *STATE_COLUMNS], tablefmt="github", disable_numparse=True),
        "",
        f"min {result.minimum:.2f} s, median {result.median:.2f} s, max {result.maximum:.2f} s "
        f"(spread {100 * result.relative:.0f}%)",
    ]
    lines += [f"Warning: {w}" for w in result.warnings]
    return "\n".join(lines)
