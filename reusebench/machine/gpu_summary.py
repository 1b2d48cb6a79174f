"""GPU readings and the pure arithmetic that turns them into one summary per measured step."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import pynvml


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. A field is None when NVML could not give it."""

    t: float  # time.monotonic() when the reading began
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    energy_j: float | None = None  # NVML's running total since the driver loaded
    pstate: int | None = None  # 0 = highest performance ... 15
    clock_event_reasons: int | None = None  # nvmlClocksEventReason* bitmask
    utilization_pct: int | None = None
    memory_used_mib: float | None = None
    pid_on_gpu: bool | None = None  # the watched pid is among the GPU's compute processes


@dataclass(frozen=True, slots=True)
class GpuLoss:
    """Why and when sampling of a GPU stopped for good."""

    t: float
    reason: str


@dataclass(frozen=True, slots=True)
class GpuTrace:
    """Everything sampled from one GPU, oldest first."""

    index: int
    name: str
    samples: tuple[GpuSample, ...]
    lost: GpuLoss | None = None


def _reason_bits() -> dict[int, str]:
    # Bit -> name from pynvml's own constants, so a newer binding brings its new reasons along;
    # the older "throttle" spelling only adds bits the "event" spelling lacks.
    names: dict[int, str] = {}
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        for attr in dir(pynvml):
            name = attr.removeprefix(prefix)
            if name == attr or name in ("None", "All", "UserDefinedClocks"):  # UserDefined: deprecated alias
                continue
            names.setdefault(getattr(pynvml, attr), name)
    return dict(sorted(names.items()))


REASON_BITS = _reason_bits()
GPU_IDLE = pynvml.nvmlClocksEventReasonGpuIdle
# Idle and a fixed application clock lower clocks by choice, not because the GPU is held back.
NOT_THROTTLING = GPU_IDLE | pynvml.nvmlClocksEventReasonApplicationsClocksSetting


def reason_names(mask: int) -> tuple[str, ...]:
    """Names of the bits set in a clock-event reasons mask, lowest bit first; unknown bits as hex."""
    bits = (1 << i for i in range(mask.bit_length()) if mask >> i & 1)
    return tuple(REASON_BITS.get(bit, hex(bit)) for bit in bits)


def is_throttled(mask: int) -> bool:
    return bool(mask & ~NOT_THROTTLING)


def is_idle(sample: GpuSample) -> bool | None:
    """Idle: utilization 0 or the GPU_IDLE clock-event reason. None when neither is known."""
    known = [
        v
        for v in (
            None if sample.utilization_pct is None else sample.utilization_pct == 0,
            None if sample.clock_event_reasons is None else bool(sample.clock_event_reasons & GPU_IDLE),
        )
        if v is not None
    ]
    return any(known) if known else None


def idle_before(samples: Sequence[GpuSample], start: float) -> float | None:
    """Seconds the GPU had been idle at `start`, from the first sample of the idle run reaching it.

    0.0 when busy at the last reading before `start`; None when there is none or idleness is
    unknown. A run that reaches back to the first sample is a lower bound (sampling began idle).
    """
    before = [s for s in samples if s.t <= start]
    if not before or is_idle(before[-1]) is None:
        return None
    idle_since = None
    for sample in reversed(before):
        if not is_idle(sample):
            break
        idle_since = sample.t
    return 0.0 if idle_since is None else start - idle_since


def _value_at(points: Sequence[tuple[float, float]], t: float) -> float:
    """Piecewise-linear value at t, held constant beyond the first and last points."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return points[-1][1]


def _integral(points: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Trapezoidal integral of the piecewise-linear function over [start, end]."""
    ts = [start, *(t for t, _ in points if start < t < end), end]
    vs = [_value_at(points, t) for t in ts]
    return sum((t1 - t0) * (v0 + v1) / 2 for t0, t1, v0, v1 in zip(ts, ts[1:], vs, vs[1:]))


def _brackets(points: Sequence[tuple[float, float]], start: float, end: float) -> bool:
    return bool(points) and points[0][0] <= start and points[-1][0] >= end


def step_energy(samples: Sequence[GpuSample], start: float, end: float) -> tuple[float | None, str | None]:
    """Joules used in [start, end] and how they were found: "counter" or "power" (integrated).

    The energy counter is read at start and end by linear interpolation between its samples;
    a counter that is missing or went backwards (driver reload) falls back to integrating power.
    None unless readings exist at or before start and at or after end: no extrapolation.
    """
    counter = [(s.t, s.energy_j) for s in samples if s.energy_j is not None]
    if _brackets(counter, start, end):
        used = _value_at(counter, end) - _value_at(counter, start)
        if used >= 0:
            return used, "counter"
    power = [(s.t, s.power_w) for s in samples if s.power_w is not None]
    if _brackets(power, start, end):
        return _integral(power, start, end), "power"
    return None, None


COLD_IDLE_S = 60.0
COLD_CLOCK_RATIO = 0.5
COLD_TEMP_BELOW_MAX_C = 10
WARMTH_RULE = (
    f"cold if the GPU had been idle >= {COLD_IDLE_S:g} s before the step (it had dropped to an idle "
    f"P-state), or its SM clock at the start was < {COLD_CLOCK_RATIO:.0%} of the step's highest (clocks "
    f"had to ramp up), or its temperature at the start was >= {COLD_TEMP_BELOW_MAX_C} C below the step's "
    "highest (not at working temperature, so boost behaviour changed during the step); warm otherwise; "
    "None when none of these is known"
)


def _cold_reasons(
    idle_s: float | None, start: GpuSample, max_sm: int | None, max_temp: int | None
) -> tuple[str, ...] | None:
    """The WARMTH_RULE clauses that hold; None when no clause could be evaluated."""
    checks: list[str | None] = []
    if idle_s is not None:
        checks.append(f"idle {idle_s:.1f} s before the step" if idle_s >= COLD_IDLE_S else None)
    if start.sm_clock_mhz is not None and max_sm:
        ramped = start.sm_clock_mhz < COLD_CLOCK_RATIO * max_sm
        checks.append(f"SM clock {start.sm_clock_mhz} MHz at start, step max {max_sm} MHz" if ramped else None)
    if start.temperature_c is not None and max_temp is not None:
        cool = max_temp - start.temperature_c >= COLD_TEMP_BELOW_MAX_C
        checks.append(f"{start.temperature_c} C at start, step max {max_temp} C" if cool else None)
    if not checks:
        return None
    return tuple(c for c in checks if c is not None)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class StepGpuSummary:
    """The state of one GPU around one measured step. See WARMTH_RULE for `warmth`."""

    gpu: int
    name: str
    samples: int  # readings inside the step
    start_temperature_c: int | None
    start_sm_clock_mhz: int | None
    start_mem_clock_mhz: int | None
    start_pstate: int | None
    idle_before_s: float | None
    sm_clock_mean_mhz: float | None
    sm_clock_max_mhz: int | None
    temperature_mean_c: float | None
    temperature_max_c: int | None
    power_mean_w: float | None
    power_max_w: float | None
    energy_j: float | None
    energy_source: str | None  # "counter" or "power"
    throttle_reasons: tuple[str, ...]
    throttled_fraction: float | None  # of readings with any reason but idle / application clocks
    pid_on_gpu: bool | None
    warmth: str | None  # "warm" or "cold"
    cold_because: tuple[str, ...]
    lost: str | None  # why sampling of this GPU stopped, if it did before the step ended

    def to_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def null_dict(cls) -> dict[str, object]:
        """The same keys, all null: a step measured without a GPU."""
        return dict.fromkeys(f.name for f in dataclasses.fields(cls))


def summarize(trace: GpuTrace, start: float, end: float) -> StepGpuSummary | None:
    """Summarize `trace` over the step [start, end]. None when the GPU was never read.

    The state at start is the last reading at or before `start`. A step shorter than the
    sampling period, with no reading inside it, is described by that reading.
    """
    if not trace.samples:
        return None
    # Readings from before a loss say nothing about a step that began after it.
    samples = () if trace.lost is not None and trace.lost.t <= start else trace.samples
    inside = [s for s in samples if start <= s.t <= end]
    first = next((s for s in reversed(samples) if s.t <= start), inside[0] if inside else GpuSample(t=start))
    described = inside or [first]

    sm = [s.sm_clock_mhz for s in described if s.sm_clock_mhz is not None]
    temps = [s.temperature_c for s in described if s.temperature_c is not None]
    power = [s.power_w for s in described if s.power_w is not None]
    masks = [s.clock_event_reasons for s in described if s.clock_event_reasons is not None]
    throttled = [m for m in masks if is_throttled(m)]
    seen = 0
    for mask in throttled:
        seen |= mask
    pids = [s.pid_on_gpu for s in described if s.pid_on_gpu is not None]
    idle_s = idle_before(samples, start)
    energy, source = step_energy(samples, start, end)
    cold = _cold_reasons(idle_s, first, max(sm, default=None), max(temps, default=None))
    return StepGpuSummary(
        gpu=trace.index,
        name=trace.name,
        samples=len(inside),
        start_temperature_c=first.temperature_c,
        start_sm_clock_mhz=first.sm_clock_mhz,
        start_mem_clock_mhz=first.mem_clock_mhz,
        start_pstate=first.pstate,
        idle_before_s=idle_s,
        sm_clock_mean_mhz=_mean(sm),
        sm_clock_max_mhz=max(sm, default=None),
        temperature_mean_c=_mean(temps),
        temperature_max_c=max(temps, default=None),
        power_mean_w=_mean(power),
        power_max_w=max(power, default=None),
        energy_j=energy,
        energy_source=source,
        throttle_reasons=reason_names(seen & ~NOT_THROTTLING),
        throttled_fraction=len(throttled) / len(masks) if masks else None,
        pid_on_gpu=any(pids) if pids else None,
        warmth=None if cold is None else "cold" if cold else "warm",
        cold_because=cold or (),
        lost=trace.lost.reason if trace.lost is not None and trace.lost.t <= end else None,
    )
