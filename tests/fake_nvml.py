"""A stand-in for the pynvml module, driven by a scripted timeline of readings, that records its calls.

Function names, signatures, units and constants are the real module's; errors are pynvml's own
exception classes, so `except pynvml.NVMLError_NotSupported` catches what the fake raises.

Each GPU replays its timeline one reading per sampling round: a round ends when a call is made
twice (the sampler asks each thing once per round), so the k-th round sees the k-th reading
whatever the sampler's timing. The last reading repeats once the timeline runs out.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

NVMLError = pynvml.NVMLError


@dataclass(frozen=True)
class Reading:
    """What one GPU reports during one round, in NVML's units. `errors`: call name -> error it raises."""

    sm_mhz: int = 1980
    mem_mhz: int = 3201
    temp_c: int = 55
    power_mw: int = 400_000
    pstate: int = 0
    reasons: int = 0
    util_pct: int = 100
    mem_used_bytes: int = 20 * 2**30
    pids: tuple[int, ...] = ()
    errors: dict[str, NVMLError] = field(default_factory=dict)


IDLE = Reading(sm_mhz=345, mem_mhz=405, temp_c=31, power_mw=75_000, pstate=8,
               reasons=pynvml.nvmlClocksEventReasonGpuIdle, util_pct=0)
LOST = Reading(errors={"*": pynvml.NVMLError_GpuIsLost()})


class FakeGpu:
    def __init__(self, timeline: list[Reading], name: str = "NVIDIA H200", round_s: float = 0.1) -> None:
        self.name = name
        self.timeline = timeline
        self.round_s = round_s  # nominal time per reading, for the energy counter
        self.round = 0
        self.energy_mj = 1_000_000  # the counter runs since the driver loaded, not from 0
        self._asked: set[tuple[Any, ...]] = set()

    def reading(self, call: tuple[Any, ...]) -> Reading:
        if call in self._asked:  # asked again: a new round
            self._asked.clear()
            self.round += 1
            self.energy_mj += self.current.power_mw * self.round_s
        self._asked.add(call)
        current = self.current
        error = current.errors.get(call[0], current.errors.get("*"))
        if error is not None:
            raise error
        return current

    @property
    def current(self) -> Reading:
        return self.timeline[min(self.round, len(self.timeline) - 1)]


class FakeNvml:
    """Module-like: use it where `pynvml` would be. `init_error` makes nvmlInit fail with it."""

    def __init__(self, gpus: list[FakeGpu], init_error: NVMLError | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.initialized = False
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Constants and exception classes come from the real module.
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _read(self, name: str, handle: FakeGpu, *args: Any) -> Reading:
        with self._lock:
            self.calls[name] += 1
            if not self.initialized:
                raise pynvml.NVMLError_Uninitialized()
            return handle.reading((name, *args))

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, type: int) -> int:
        r = self._read("nvmlDeviceGetClockInfo", handle, type)
        return {pynvml.NVML_CLOCK_SM: r.sm_mhz, pynvml.NVML_CLOCK_MEM: r.mem_mhz}[type]

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return self._read("nvmlDeviceGetTemperature", handle, sensor).temp_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return self._read("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._read("nvmlDeviceGetTotalEnergyConsumption", handle)
        return int(handle.energy_mj)

    def nvmlDeviceGetPerformanceState(self, handle: FakeGpu) -> int:
        return self._read("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return self._read("nvmlDeviceGetCurrentClocksEventReasons", handle).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return self._read("nvmlDeviceGetCurrentClocksThrottleReasons", handle).reasons

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        r = self._read("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=r.util_pct, memory=r.util_pct // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        r = self._read("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=141 * 2**30, used=r.mem_used_bytes, free=141 * 2**30 - r.mem_used_bytes)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        r = self._read("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in r.pids]
