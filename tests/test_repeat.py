"""Repeated cold first loads (--repeat-first-load) on a real llama-server: records, progress, the spread report.

The no-GPU path is the one this CPU machine (and CI) runs; the GPU path drives the sampler
with the fake NVML, which reports one repeat as throttled.
"""

from __future__ import annotations

import io
import math
import statistics
import threading
import time
import warnings
from pathlib import Path

import pynvml
import pytest

from reusebench import cli, records
from reusebench.config import profiles
from reusebench.llama import process
from reusebench.machine.gpu import GpuSampler
from reusebench.machine.spread import spread
from reusebench.report import run_report as report
from reusebench.run import runner
from reusebench.run.selection import Repeats, Selection
from test_asv_flow import REPO, asv_env, discover
from test_spread import repeat

from conftest import SLOW_MACHINE_S
from fake_nvml import FakeGpu, FakeNvml, Reading

PROFILE, VARIANT = "tiny-qwen35", "mmproj=off,cache-reuse=0"
FAST_HZ = 200.0  # the fake answers at once
BUSY = Reading()
THROTTLED = Reading(sm_mhz=1100, temp_c=88, reasons=pynvml.nvmlClocksEventReasonSwThermalSlowdown)


def has_gpu() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_report_a_fast_first_repeat_after_standby_is_flagged():
    warnings = spread([repeat(1053.5, temp=30.0), repeat(1290.0), repeat(1452.0)]).warnings
    assert any("first repeat took 1053.50 s against 1371.00 s" in w and "rested machine" in w for w in warnings)


def test_a_first_repeat_within_the_range_of_the_rest_is_not_flagged():
    # 0.27 s would be the median of one fast and one slow repeat, not a typical one
    assert not any("first repeat" in w for w in spread([repeat(0.10), repeat(0.45), repeat(0.10)]).warnings)


@pytest.mark.e2e
def test_repeat_run_on_cpu_records_host_state_and_reports_the_spread(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # acceptance: no warnings beyond the one no-GPU line
        status = cli.main(["run", "--profile", PROFILE, "--variant", VARIANT, "--size", "2K",
                           "--repeat-first-load", "3", "--results", str(tmp_path)])
    out, err = capfd.readouterr()
    assert status == 0
    progress = [line.split(":")[0] for line in err.splitlines() if line.startswith("repeat ")]
    assert progress == [f"repeat {n}/3 [{PROFILE}/{VARIANT}@2048#r{n}]" for n in (1, 2, 3)]
    gpu = has_gpu()
    if not gpu:
        assert len([line for line in err.splitlines() if "no NVIDIA GPU found" in line]) == 1
    assert not [line for line in err.splitlines() if "warn" in line.lower()]

    (run_dir,) = (tmp_path / "runs").iterdir()
    loads = [r for r in records.read_records(run_dir / "records.jsonl") if r.role == records.Role.MEASURE]
    assert [(r.scenario, r.step, r.extra["repeat"]) for r in loads] == [("first_load", "cold", n) for n in (1, 2, 3)]
    assert len({r.session for r in loads}) == 3  # a fresh server each time
    for r in loads:
        assert r.host["model_page_cache_fraction"] is not None
        assert r.host["cpu_count"] and r.host["load_avg_1m"] is not None
        assert r.prompt_n == r.prompt_tokens  # cold: nothing reused
        if not gpu:
            assert set(r.gpu.values()) == {None}

    assert cli.main(["report", str(run_dir)]) == 0
    reported = capfd.readouterr().out
    for text in (out, reported, (run_dir / "report.md").read_text()):
        assert f"## first-load repeats: {PROFILE} [{VARIANT}] @ 2K" in text
        assert "| repeat   | prefill s   | start temp C   | mean SM MHz" in text
        assert "min " in text and ", median " in text and ", max " in text
    assert "cold (repeat 3)" in reported
    check_asv_tracks(loads, monkeypatch)


def check_asv_tracks(loads: list[records.Record], monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/gpu_state.py on the repeats' records: n/a (NaN) for GPU state on a CPU, the spread in order."""
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import common, gpu_state

    cache = common.summarise(loads, ["records.jsonl"], failed_sessions=0)
    state, spread_ = gpu_state.FirstLoadGpuState(), gpu_state.FirstLoadSpread()
    args = (cache, "2K", VARIANT)
    assert math.isnan(state.track_start_temperature_c(*args))
    # the median of what the repeats' records say (NaN, asv's n/a, would fail here: the host measured it)
    cached = [r.host["model_page_cache_fraction"] for r in loads]
    assert state.track_model_page_cache_fraction(*args) == statistics.median(cached)
    low, middle, high = (track(*args) for track in (spread_.track_min_seconds,
                                                    spread_.track_median_seconds,
                                                    spread_.track_max_seconds))
    assert 0 < low <= middle <= high


def test_asv_discovers_the_gpu_state_units(tmp_path: Path):
    found = discover(tmp_path, asv_env(tmp_path))
    units = {name.rsplit(".", 1)[1]: b["unit"] for name, b in found.items() if name.startswith("gpu_state.")}
    assert units["track_start_temperature_c"] == "degrees C"
    assert units["track_sm_clock_mean_mhz"] == "MHz"
    assert units["track_max_seconds"] == "seconds"


class FollowsThrottle(FakeGpu):
    """A GPU that reports thermal throttling while `throttling` is set, full speed otherwise."""

    def __init__(self, throttling: threading.Event) -> None:
        super().__init__([BUSY])
        self.throttling = throttling

    @property
    def current(self) -> Reading:
        return THROTTLED if self.throttling.is_set() else BUSY

    def read_anew(self) -> None:
        """Wait until the sampler has begun and finished a whole round since now: it has seen the current state."""
        seen = self.round + 2
        deadline = time.monotonic() + SLOW_MACHINE_S  # a hang's limit: it ends at the second round
        while self.round < seen:
            assert time.monotonic() < deadline, f"the GPU sampler took no reading for {SLOW_MACHINE_S:.0f} s"
            time.sleep(0.001)


@pytest.mark.e2e
def test_the_throttled_repeat_carries_its_state_and_the_report_warns_as_its_seconds_say(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake GPU throttles during repeat 2 only, from its server's start to its stop. That arrangement fixes
    each repeat's GPU state exactly; which repeat is slowest is the CPU's business, so the report's warnings are
    checked against what spread() derives from the recorded seconds. That a throttled slow repeat is named is
    test_spread.py's, on given seconds."""
    throttled_repeat, starts = 2, []
    throttling = threading.Event()
    gpu = FollowsThrottle(throttling)
    start, stop = process.ServerProcess.start, process.ServerProcess.stop

    def start_and_throttle(self: process.ServerProcess) -> process.ServerProcess:
        started = start(self)
        starts.append(self.pid)
        if len(starts) == throttled_repeat:  # throttled from health to stop, the measured load included
            throttling.set()
            gpu.read_anew()
        return started

    def release_and_stop(self: process.ServerProcess) -> int | None:
        if throttling.is_set() and self.pid == starts[throttled_repeat - 1]:
            throttling.clear()
            gpu.read_anew()  # the next repeat's state before its start is full speed
        return stop(self)

    monkeypatch.setattr(process.ServerProcess, "start", start_and_throttle)
    monkeypatch.setattr(process.ServerProcess, "stop", release_and_stop)
    result = runner.run_profile(
        profiles.load_profile(PROFILE), Selection((VARIANT,), (1024,), repeats=Repeats(3)), results_dir=tmp_path,
        sampler_factory=lambda: GpuSampler(FAST_HZ, nvml=FakeNvml([gpu])),
        out=io.StringIO(),
    )
    assert result.failed_sessions == 0 and len(starts) == 3
    loads = [r for r in result.records if r.role == records.Role.MEASURE]
    assert [r.gpu["throttled_fraction"] for r in loads] == [0.0, 1.0, 0.0]
    assert loads[1].gpu["throttle_reasons"] == ["SwThermalSlowdown"]
    assert loads[1].gpu["start_temperature_c"] == 88 and loads[0].gpu["sm_clock_mean_mhz"] == 1980
    text = report.render_text(result.records)
    assert "| 2        |" in text and "| 88             | 1100          | 1.00" in text
    derived = spread(loads)
    assert f"min {derived.minimum:.2f} s, median {derived.median:.2f} s, max {derived.maximum:.2f} s" in text
    assert [line.removeprefix("Warning: ") for line in text.splitlines() if line.startswith("Warning: ")] == list(
        derived.warnings)
    slow = [r.extra["repeat"] for r in loads if r.prompt_ms > statistics.median(x.prompt_ms for x in loads)]
    # repeat 2 is throttled, so the coincidence is named exactly when repeat 2 is the slower of the median's two sides
    assert ("throttling coincides with the slow repeat(s) 2" in derived.warnings) == (slow == [2])
