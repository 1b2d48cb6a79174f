"""Arithmetic and warnings of the repeated first-load summary, on recorded figures."""

from __future__ import annotations

import pytest

from reusebench.machine.spread import render, spread
from reusebench.records import Record


def repeat(seconds: float, *, throttled: float = 0.0, page_cache: float | None = 1.0, temp: float = 45.0) -> Record:
    return Record(
        run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=131072,
        scenario="first_load", step="cold", role="measure", endpoint="/completion", started_at=0.0, ended_at=0.0,
        prompt_ms=seconds * 1000,
        gpu={"start_temperature_c": temp, "sm_clock_mean_mhz": 1800.0, "throttled_fraction": throttled,
             "idle_before_s": 3.0, "warmth": "warm"},
        host={"model_page_cache_fraction": page_cache},
    )


def test_report_a_spread_min_median_max():
    result = spread([repeat(1053.5), repeat(1290.0), repeat(1452.0)])  # 17.6, 21.5, 24.2 minutes
    assert (result.minimum, result.median, result.maximum) == (1053.5, 1290.0, 1452.0)
    assert result.relative == pytest.approx(0.378, abs=1e-3)


def test_a_cold_first_repeat_is_flagged():
    result = spread([repeat(30.0, page_cache=0.0), repeat(20.0), repeat(20.5), repeat(19.8)])
    assert any("first repeat took 30.00 s" in w for w in result.warnings)
    assert any("not in the page cache before repeat(s) 1" in w for w in result.warnings)


def test_throttling_that_coincides_with_the_slow_repeats_is_named():
    result = spread([repeat(20.0), repeat(26.0, throttled=0.4), repeat(20.2), repeat(25.0, throttled=0.2)])
    assert "throttling coincides with the slow repeat(s) 2, 4" in result.warnings


def test_throttling_on_a_fast_repeat_is_not_blamed():
    result = spread([repeat(20.0, throttled=0.4), repeat(26.0), repeat(20.2)])
    assert not any("throttling" in w for w in result.warnings)


def test_outlier_by_median_absolute_deviation():
    result = spread([repeat(20.0), repeat(20.1), repeat(19.9), repeat(20.05), repeat(40.0)])
    assert any("outliers: repeat(s) 5" in w for w in result.warnings)


def test_steady_repeats_raise_no_warning():
    assert spread([repeat(20.0), repeat(20.1), repeat(19.9)]).warnings == ()


def test_table_puts_state_beside_each_repeat():
    text = render([repeat(20.0, temp=38.0), repeat(21.0, throttled=0.5)])
    assert "| 1        | 20.00       | 38" in text and "0.50" in text
    assert "min 20.00 s, median 20.50 s, max 21.00 s" in text


def test_no_gpu_fields_render_as_dashes():
    r = repeat(10.0)
    r.gpu = {}
    assert "| -" in render([r])
