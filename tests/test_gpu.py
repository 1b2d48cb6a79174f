import json
import threading
import time
from collections.abc import Callable

import pynvml
import pytest

from reusebench.machine.gpu import GpuSampler
from reusebench.machine.gpu_summary import (
    COLD_IDLE_S,
    GpuLoss,
    GpuSample,
    GpuTrace,
    StepGpuSummary,
    idle_before,
    reason_names,
    step_energy,
    summarize,
)

from conftest import SLOW_MACHINE_S
from fake_nvml import IDLE, LOST, FakeGpu, FakeNvml, Reading

FAST_HZ = 200.0  # the fake answers at once; tests need rounds, not realism
HW_SLOW = pynvml.nvmlClocksEventReasonHwSlowdown
SW_THERMAL = pynvml.nvmlClocksEventReasonSwThermalSlowdown
GPU_IDLE = pynvml.nvmlClocksEventReasonGpuIdle


def wait_until(condition: Callable[[], bool], what: str = "the sampler's readings",
               timeout: float = SLOW_MACHINE_S) -> None:
    """Wait for an event of the sampler; the fake answers at once, so the limit is only for one that never comes."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not come within {timeout:.0f} s"
        time.sleep(0.002)


def sampled(sampler: GpuSampler, gpu: int = 0) -> tuple[GpuSample, ...]:
    return sampler.traces()[gpu].samples


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "reusebench-gpu-sampler"]


def trace(*samples: GpuSample, lost: GpuLoss | None = None) -> GpuTrace:
    return GpuTrace(0, "test GPU", samples, lost)


# --- the sampler against NVML -------------------------------------------------------------


def test_no_gpu_with_real_pynvml_is_unavailable_not_an_error():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA GPU")
    with GpuSampler() as s:
        start = s.mark()
        summary = s.summary(start, s.mark())
        record = s.summary_dict(start, s.mark())
    assert s.unavailable is not None and s.unavailable.startswith("no NVIDIA GPU found: ")
    assert "NVMLError_LibraryNotFound" in s.unavailable
    assert summary is None
    assert set(record) == set(StepGpuSummary.null_dict()) and all(v is None for v in record.values())
    assert s.traces() == [] and not sampler_threads()


def test_driver_not_loaded_is_unavailable_with_one_reason():
    fake = FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        pass
    assert s.unavailable == "no NVIDIA GPU found: NVMLError_DriverNotLoaded: Driver Not Loaded"
    assert fake.calls["nvmlInit"] == 1


def test_zero_devices_is_unavailable_and_shuts_nvml_down():
    fake = FakeNvml([])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        pass
    assert s.unavailable == "no NVIDIA GPU found: NVML sees 0 devices"
    assert fake.calls["nvmlShutdown"] == 1


def test_samples_convert_nvml_units():
    fake = FakeNvml([FakeGpu([Reading(power_mw=412_500, mem_used_bytes=3 * 2**30, reasons=HW_SLOW)])])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        wait_until(lambda: len(sampled(s)) >= 2)
    first, second = sampled(s)[:2]
    assert (first.sm_clock_mhz, first.mem_clock_mhz, first.temperature_c, first.pstate) == (1980, 3201, 55, 0)
    assert first.power_w == 412.5 and first.memory_used_mib == 3072
    assert first.clock_event_reasons == HW_SLOW and first.utilization_pct == 100
    assert first.energy_j == 1000.0 and second.energy_j == pytest.approx(1000.0 + 41.25)  # mJ -> J
    assert first.pid_on_gpu is None  # no pid to look for
    assert s.traces()[0].name == "NVIDIA H200"


def test_not_supported_field_is_none_and_not_asked_again():
    no_power = Reading(errors={"nvmlDeviceGetPowerUsage": pynvml.NVMLError_NotSupported()})
    fake = FakeNvml([FakeGpu([no_power])])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        wait_until(lambda: len(sampled(s)) >= 5)
    samples = sampled(s)
    assert all(x.power_w is None for x in samples)
    assert all(x.sm_clock_mhz == 1980 and x.energy_j is not None for x in samples)
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert s.traces()[0].lost is None


def test_old_driver_falls_back_to_throttle_reasons():
    old = Reading(reasons=SW_THERMAL, errors={"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVMLError_FunctionNotFound()})
    fake = FakeNvml([FakeGpu([old])])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        wait_until(lambda: len(sampled(s)) >= 3)
    assert all(x.clock_event_reasons == SW_THERMAL for x in sampled(s))
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] >= 3


def test_pid_is_looked_for_among_compute_processes_and_can_change():
    fake = FakeNvml([FakeGpu([Reading(pids=(4242,))]), FakeGpu([Reading(pids=(7,))])])
    with GpuSampler(FAST_HZ, pid=4242, nvml=fake) as s:
        wait_until(lambda: len(sampled(s, 1)) >= 2)
        start = s.mark()
        wait_until(lambda: sampled(s, 1)[-1].t > start)
        seen_on_first = s.summary(start, s.mark())
        s.pid = 7  # the server restarted
        restart = s.mark()
        wait_until(lambda: sampled(s, 1)[-1].t > restart)
        seen_on_second = s.summary(restart, s.mark())
    assert all(x.pid_on_gpu for x in sampled(s, 0) if x.t <= start)
    assert seen_on_first is not None and seen_on_first.gpu == 0 and seen_on_first.pid_on_gpu
    assert seen_on_second is not None and seen_on_second.gpu == 1
    assert s.summary(restart, s.mark(), gpu=0).pid_on_gpu is False


def test_gpu_lost_mid_run_keeps_its_samples_and_the_reason():
    fake = FakeNvml([FakeGpu([Reading()] * 10), FakeGpu([Reading()] * 3 + [LOST])])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        start = s.mark()
        wait_until(lambda: s.traces()[1].lost is not None and len(sampled(s, 0)) >= 8)
        end = s.mark()
        summary = s.summary(start, end, gpu=1)
        after = s.summary(end, s.mark(), gpu=1)
    healthy, lost = s.traces()
    assert len(lost.samples) == 3 and all(x.sm_clock_mhz == 1980 for x in lost.samples)
    assert lost.lost is not None and "NVMLError_GpuIsLost" in lost.lost.reason
    assert healthy.lost is None and len(healthy.samples) > len(lost.samples)  # the other GPU went on
    assert summary is not None and summary.lost == lost.lost.reason and summary.sm_clock_max_mhz == 1980
    assert after is not None and after.samples == 0 and after.sm_clock_mean_mhz is None and after.energy_j is None


def test_gpu_failing_every_call_counts_as_lost_and_thread_ends():
    unknown = Reading(errors={"*": pynvml.NVMLError_Unknown()})
    fake = FakeNvml([FakeGpu([Reading(), unknown])])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        wait_until(lambda: not sampler_threads())  # nothing left to sample: the thread stops itself
    (only,) = s.traces()
    assert len(only.samples) == 1
    assert only.lost is not None and "NVMLError_Unknown" in only.lost.reason


def test_thread_is_joined_when_the_body_raises():
    fake = FakeNvml([FakeGpu([Reading()])])
    with pytest.raises(RuntimeError, match="body failed"):
        with GpuSampler(FAST_HZ, nvml=fake):
            assert len(sampler_threads()) == 1
            raise RuntimeError("body failed")
    assert not sampler_threads()
    assert fake.calls["nvmlShutdown"] == 1 and not fake.initialized


def test_sampler_takes_at_most_one_round_a_period_and_measures_its_own_cpu_cost():
    """Rounds are scheduled a period apart from the start and a late one is not caught up in a burst, so n rounds
    span at least n - 1 periods from before the start, however loaded the machine. How many rounds it manages is
    the machine's business."""
    period = 1 / 50
    fake = FakeNvml([FakeGpu([Reading()])])
    before = time.monotonic()
    with GpuSampler(50, nvml=fake) as s:
        wait_until(lambda: len(sampled(s)) >= 10, "ten rounds")
        cpu_s, wall_s = s.cpu_seconds, time.monotonic() - before
    samples = sampled(s)
    assert (len(samples) - 1) * period <= samples[-1].t - before
    assert 0 < cpu_s <= wall_s  # a thread cannot use more CPU time than it has existed


def test_summary_waits_for_a_reading_after_the_step():
    fake = FakeNvml([FakeGpu([Reading()])])
    with GpuSampler(20, nvml=fake) as s:
        start = s.mark()
        end = s.mark()  # a step far shorter than the 50 ms period
        summary = s.summary(start, end)
    assert summary is not None and summary.energy_source == "counter" and summary.energy_j is not None
    assert sampled(s)[-1].t >= end


def test_idle_then_load_through_the_sampler_is_cold():
    fake = FakeNvml([FakeGpu([IDLE] * 5 + [Reading()] * 50)])
    with GpuSampler(FAST_HZ, nvml=fake) as s:
        wait_until(lambda: len(sampled(s)) >= 15)
        samples = sampled(s)
        summary = s.summary(samples[4].t, samples[14].t)  # from the last idle reading
    assert summary is not None
    assert (summary.start_sm_clock_mhz, summary.start_pstate, summary.start_temperature_c) == (345, 8, 31)
    assert summary.idle_before_s == pytest.approx(samples[4].t - samples[0].t)
    assert summary.samples == 11 and summary.sm_clock_max_mhz == 1980
    assert summary.warmth == "cold" and len(summary.cold_because) == 2  # clock ramp and temperature


# --- summaries: arithmetic on recorded samples -------------------------------------------


def busy(t: float, **fields) -> GpuSample:
    values = dict(sm_clock_mhz=1980, mem_clock_mhz=3201, temperature_c=60, power_w=500.0, pstate=0,
                  clock_event_reasons=0, utilization_pct=100)
    return GpuSample(t=t, **values | fields)


def idle(t: float) -> GpuSample:
    return GpuSample(t=t, sm_clock_mhz=345, temperature_c=30, power_w=75.0, pstate=8,
                     clock_event_reasons=GPU_IDLE, utilization_pct=0)


def test_throttled_half_the_step():
    masks = [HW_SLOW | SW_THERMAL, 0, HW_SLOW, GPU_IDLE, SW_THERMAL, 0, HW_SLOW, 0]
    samples = [busy(i * 0.1, clock_event_reasons=m) for i, m in enumerate(masks)]
    summary = summarize(trace(*samples), 0.0, 1.0)
    assert summary.throttled_fraction == 0.5
    assert summary.throttle_reasons == ("HwSlowdown", "SwThermalSlowdown")  # idle is not throttling


def test_unknown_reasons_are_left_out_of_the_fraction():
    samples = [busy(0.0, clock_event_reasons=HW_SLOW), busy(0.1, clock_event_reasons=None), busy(0.2)]
    assert summarize(trace(*samples), 0.0, 0.2).throttled_fraction == 0.5


def test_reason_names_decode_every_bit():
    assert reason_names(0) == ()
    assert reason_names(GPU_IDLE | pynvml.nvmlClocksThrottleReasonBoardLimit | 1 << 40) == (
        "GpuIdle", "BoardLimit", hex(1 << 40))


def test_idle_for_a_minute_then_load_is_cold():
    samples = [idle(float(t)) for t in range(0, 71)] + [busy(70.5 + t / 10) for t in range(10)]
    summary = summarize(trace(*samples), 70.2, 71.4)
    assert summary.idle_before_s == pytest.approx(70.2) and summary.idle_before_s >= COLD_IDLE_S
    assert (summary.start_sm_clock_mhz, summary.start_pstate) == (345, 8)
    assert summary.samples == 10 and summary.sm_clock_mean_mhz == 1980
    assert summary.warmth == "cold" and len(summary.cold_because) == 3


def test_busy_before_the_step_is_warm():
    samples = [busy(t / 10) for t in range(20)]
    summary = summarize(trace(*samples), 1.0, 1.9)
    assert summary.idle_before_s == 0.0
    assert summary.warmth == "warm" and summary.cold_because == ()


def test_a_short_idle_gap_is_not_cold_by_itself():
    samples = [busy(0.0), idle(1.0), idle(2.0)] + [busy(2.0 + t / 10) for t in range(1, 10)]
    summary = summarize(trace(*samples), 2.05, 2.9)
    assert summary.idle_before_s == pytest.approx(1.05)
    assert summary.warmth == "cold" and summary.cold_because[0].startswith("SM clock 345 MHz")


def test_idle_time_unknown_without_utilization_or_reasons():
    samples = [GpuSample(t=0.0, sm_clock_mhz=1000), GpuSample(t=1.0, sm_clock_mhz=1000)]
    assert idle_before(samples, 1.0) is None
    summary = summarize(trace(*samples), 1.0, 1.0)
    assert summary.warmth == "warm"  # the clock clause could be judged, and held
    assert summarize(trace(GpuSample(t=0.0)), 0.0, 1.0).warmth is None


def test_energy_from_the_counter_interpolates_between_readings():
    samples = [GpuSample(t=float(t), energy_j=100.0 + 300 * t, power_w=1.0) for t in range(4)]
    assert step_energy(samples, 0.5, 2.5) == (pytest.approx(600.0), "counter")
    assert step_energy(samples, 1.0, 1.0) == (0.0, "counter")


def test_energy_falls_back_to_integrated_power():
    samples = [GpuSample(t=0.0, power_w=100.0), GpuSample(t=1.0, power_w=300.0), GpuSample(t=2.0, power_w=300.0)]
    assert step_energy(samples, 0.0, 2.0) == (pytest.approx(200 + 300), "power")
    assert step_energy(samples, 0.5, 1.5) == (pytest.approx(125 + 150), "power")


def test_energy_counter_going_backwards_uses_power_and_no_extrapolation():
    reset = [GpuSample(t=0.0, energy_j=5000.0, power_w=200.0), GpuSample(t=1.0, energy_j=10.0, power_w=200.0)]
    assert step_energy(reset, 0.0, 1.0) == (pytest.approx(200.0), "power")
    assert step_energy(reset, 0.5, 1.5) == (None, None)  # no reading after the step's end


def test_step_shorter_than_a_period_is_described_by_the_reading_before():
    samples = [busy(0.0, sm_clock_mhz=1500, power_w=400.0), busy(0.1, sm_clock_mhz=1800, power_w=600.0)]
    summary = summarize(trace(*samples), 0.02, 0.07)
    assert summary.samples == 0 and summary.sm_clock_mean_mhz == 1500 and summary.start_sm_clock_mhz == 1500
    assert summary.energy_j == pytest.approx(0.05 * (440 + 540) / 2) and summary.energy_source == "power"


def test_step_after_the_gpu_was_lost_knows_only_why():
    loss = GpuLoss(t=1.0, reason="NVMLError_GpuIsLost: GPU is lost")
    summary = summarize(trace(busy(0.0), busy(0.5), lost=loss), 2.0, 3.0)
    assert summary.lost == loss.reason and summary.start_sm_clock_mhz is None and summary.warmth is None
    assert summarize(trace(busy(0.0), busy(0.5), lost=loss), 0.0, 0.5).lost is None  # the loss came later


def test_no_samples_no_summary():
    assert summarize(trace(), 0.0, 1.0) is None


def test_summary_dict_has_the_null_dicts_keys_and_is_json():
    summary = summarize(trace(*[busy(t / 10, clock_event_reasons=HW_SLOW) for t in range(5)]), 0.0, 0.4)
    record = summary.to_dict()
    assert list(record) == list(StepGpuSummary.null_dict())
    assert json.loads(json.dumps(record))["throttle_reasons"] == ["HwSlowdown"]


# --- tools/gpu_check.py, with a fake GPU and the real (CPU) llama-server ---------------------------


def load_gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
def test_gpu_check_samples_idle_and_a_prefill_and_stops_its_server(monkeypatch, capsys):
    from reusebench import tiny

    from conftest import child_llama_servers, default_llama_server

    gpu_check = load_gpu_check()
    fake = FakeNvml([FakeGpu([IDLE] * 20 + [Reading()] * 1000)])
    monkeypatch.setattr(gpu_check, "GpuSampler", lambda: GpuSampler(rate_hz=FAST_HZ, nvml=fake))
    code = gpu_check.main(["--server", str(default_llama_server()), "--model", str(tiny.model_path("llama")),
                           "--idle-s", "0.2", "--prompt-sentences", "20", "--ctx-size", "2048"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "== prefill of " in out and "== idle, " in out and "GPU 0 NVIDIA H200:" in out
    assert not child_llama_servers()
