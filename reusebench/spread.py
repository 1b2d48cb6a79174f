"""Spread of repeated first loads, with the machine state of each repeat beside it.

Report A saw one 128K first load take 17.6, 21.5 and 24.2 minutes and could only
guess why. Each repeat here carries the GPU state at its start and during it and
whether the model file was in the page cache, and the warnings say, as hyperfine
does, when the first repeat stands apart, when a repeat is an outlier, and when
throttling or a cold page cache coincides with the slow ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tabulate import tabulate

from reusebench.records import Record

FIRST_RUN_FACTOR = 1.15  # the first repeat is flagged when it is 15% off the median of the rest
OUTLIER_MADS = 3.0  # robust outliers: beyond 3 median absolute deviations from the median


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


def _gpu(r: Record, key: str) -> float | str | None:
    return (r.gpu or {}).get(key)


def _page_cache(r: Record) -> float | None:
    return (r.host or {}).get("model_page_cache_fraction")


def spread(repeats: Sequence[Record]) -> Spread:
    """Min/median/max of first-load prefill seconds and the warnings they call for."""
    if not repeats:
        raise ValueError("no first-load repeats to summarise")
    seconds = [_seconds(r) for r in repeats]
    median = statistics.median(seconds)
    warnings: list[str] = []
    if len(seconds) >= 3:
        rest = statistics.median(seconds[1:])
        if rest and not (1 / FIRST_RUN_FACTOR <= seconds[0] / rest <= FIRST_RUN_FACTOR):
            warnings.append(
                f"the first repeat took {seconds[0]:.2f} s against {rest:.2f} s for the rest: "
                "caches or clocks were cold (compare its page-cache and GPU state); consider a warm-up"
            )
        mad = statistics.median(abs(s - median) for s in seconds)
        outliers = [i + 1 for i, s in enumerate(seconds) if mad and abs(s - median) > OUTLIER_MADS * mad]
        if outliers:
            warnings.append(f"statistical outliers: repeat(s) {', '.join(map(str, outliers))}; "
                            "other programs or power management may have interfered")
    slow = {i + 1 for i, s in enumerate(seconds) if s > median}
    throttled = {i + 1 for i, r in enumerate(repeats) if (_gpu(r, "throttled_fraction") or 0) > 0}
    if throttled and throttled <= slow:
        warnings.append(f"throttling coincides with the slow repeat(s) {', '.join(map(str, sorted(throttled)))}")
    cold_disk = [i + 1 for i, r in enumerate(repeats) if (fraction := _page_cache(r)) is not None and fraction < 0.5]
    if cold_disk:
        warnings.append(f"the model file was mostly not in the page cache before repeat(s) "
                        f"{', '.join(map(str, cold_disk))} (cold disk)")
    return Spread(tuple(seconds), min(seconds), median, max(seconds), tuple(warnings))


def _fmt(value: float | str | None, spec: str) -> str:
    return "-" if value is None else (value if isinstance(value, str) else format(value, spec))


def render(repeats: Sequence[Record]) -> str:
    """Each repeat's seconds beside its start temperature, mean SM clock, throttling and page-cache state."""
    result = spread(repeats)
    rows = [
        [i + 1, f"{_seconds(r):.2f}", _fmt(_gpu(r, "start_temperature_c"), ".0f"), _fmt(_gpu(r, "sm_clock_mean_mhz"), ".0f"),
         _fmt(_gpu(r, "throttled_fraction"), ".2f"), _fmt(_gpu(r, "idle_before_s"), ".0f"), _fmt(_gpu(r, "warmth"), ""),
         _fmt(_page_cache(r), ".2f")]
        for i, r in enumerate(repeats)
    ]
    header = ["repeat", "prefill s", "start temp C", "mean SM MHz", "throttled", "idle before s", "warm/cold",
              "model in page cache"]
    lines = [
        tabulate(rows, header, tablefmt="github", disable_numparse=True),
        "",
        f"min {result.minimum:.2f} s, median {result.median:.2f} s, max {result.maximum:.2f} s "
        f"(spread {100 * result.relative:.0f}%)",
    ]
    lines += [f"Warning: {w}" for w in result.warnings]
    return "\n".join(lines)
