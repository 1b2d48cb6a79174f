"""A background NVML sampler: GPU clocks, temperature, power, energy and clock-event reasons over a run.

    with GpuSampler(pid=server.pid) as gpus:
        start = gpus.mark()
        ...  # the measured request
        summary = gpus.summary(start, gpus.mark())

Without an NVIDIA GPU (or driver) the sampler is `unavailable`, says why once, and every summary
is None; the run goes on. Summaries are pure functions of the samples (see gpu_summary).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import pynvml

from reusebench.machine.gpu_summary import GpuLoss, GpuSample, GpuTrace, StepGpuSummary, summarize

__all__ = ["DEFAULT_RATE_HZ", "GpuSampler", "GpuSample", "GpuTrace", "GpuLoss", "StepGpuSummary", "summarize"]

DEFAULT_RATE_HZ = 10.0  # NVML counters refresh at about 10 Hz: faster only repeats readings
# A round is due within a period, later on a loaded machine; one that has not come in this long is stuck in the
# driver, and a summary goes on without it.
STUCK_ROUND_S = 10.0

# Errors that will not go away by asking again: the field is recorded as None from then on.
_PERMANENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission, pynvml.NVMLError_FunctionNotFound)


class _GpuLost(Exception):
    pass


def _readers(nvml: Any, sampler: GpuSampler) -> dict[str, Callable[[Any], Any]]:
    """GpuSample field -> how to read it from a device handle, in NVML's units converted to ours."""
    event_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    throttle_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def clock_event_reasons(handle: Any) -> int:
        # The "event" name is new (driver 535+); older drivers and bindings only know "throttle".
        nonlocal event_reasons
        if event_reasons is not None:
            try:
                return event_reasons(handle)
            except pynvml.NVMLError_FunctionNotFound:
                event_reasons = None
        if throttle_reasons is None:
            raise pynvml.NVMLError_FunctionNotFound()
        return throttle_reasons(handle)

    def pid_on_gpu(handle: Any) -> bool | None:
        pid = sampler.pid
        if pid is None:
            return None
        return any(p.pid == pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))

    def pstate(handle: Any) -> int | None:
        state = nvml.nvmlDeviceGetPerformanceState(handle)
        return None if state == nvml.NVML_PSTATE_UNKNOWN else state

    return {
        "sm_clock_mhz": lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
        "temperature_c": lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "power_w": lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000,  # mW
        "energy_j": lambda h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000,  # mJ
        "pstate": pstate,
        "clock_event_reasons": clock_event_reasons,
        "utilization_pct": lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "memory_used_mib": lambda h: nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,  # bytes
        "pid_on_gpu": pid_on_gpu,
    }


class _Device:
    """One GPU being sampled: its handle, its readings, the fields it does not support."""

    def __init__(self, nvml: Any, index: int, readers: dict[str, Callable[[Any], Any]]) -> None:
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(self.handle)
        self.name = name.decode() if isinstance(name, bytes) else name  # bytes in old bindings
        self.readers = readers
        self.unsupported: set[str] = set()
        self.samples: list[GpuSample] = []
        self.lost: GpuLoss | None = None

    def read(self, t: float) -> GpuSample:
        """One reading. Raises _GpuLost when the GPU is gone: lost, or every call failed."""
        values: dict[str, Any] = {}
        failures: list[pynvml.NVMLError] = []
        for field, read in self.readers.items():
            if field in self.unsupported:
                continue
            try:
                values[field] = read(self.handle)
            except pynvml.NVMLError_GpuIsLost as err:
                raise _GpuLost(f"{type(err).__name__}: {err}") from err
            except _PERMANENT:
                self.unsupported.add(field)
            except pynvml.NVMLError as err:
                failures.append(err)
        if failures and all(v is None for v in values.values()):
            raise _GpuLost(f"every NVML call failed, first with {type(failures[0]).__name__}: {failures[0]}")
        return GpuSample(t=t, **values)


class GpuSampler:
    """Samples every NVIDIA GPU at `rate_hz` in a daemon thread for the duration of a `with`.

    `pid` (settable: a restarted server has a new one) is looked for among each GPU's compute
    processes. NVML reports host pids, so inside a container without the host pid namespace it
    is not found. `nvml` replaces the pynvml module (tests pass a fake).
    """

    def __init__(self, rate_hz: float = DEFAULT_RATE_HZ, pid: int | None = None, nvml: Any = None) -> None:
        if rate_hz <= 0:
            raise ValueError(f"rate_hz must be positive, got {rate_hz}")
        self.period_s = 1.0 / rate_hz
        self.pid = pid
        self.unavailable: str | None = None  # why there is nothing to sample, once
        self._nvml = pynvml if nvml is None else nvml
        self._devices: list[_Device] = []
        self._cond = threading.Condition()  # guards samples and the fields below; notified per round
        self._last_round_t = float("-inf")
        self._cpu_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except pynvml.NVMLError as err:
            self.unavailable = f"no NVIDIA GPU found: {type(err).__name__}: {err}"
            return self
        try:
            readers = _readers(nvml, self)
            self._devices = [_Device(nvml, i, readers) for i in range(nvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as err:
            self.unavailable = f"no NVIDIA GPU found: {type(err).__name__}: {err}"
        if not self._devices:
            self.unavailable = self.unavailable or "no NVIDIA GPU found: NVML sees 0 devices"
            self._shutdown()
            return self
        self._thread = threading.Thread(target=self._run, name="reusebench-gpu-sampler", daemon=True)
        self._thread.start()
        with self._cond:  # a mark() right after entering must have a reading before it
            self._cond.wait_for(lambda: self._last_round_t > float("-inf") or not self._running(),
                                timeout=max(self.period_s, STUCK_ROUND_S))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # a lost GPU can make shutdown fail too; there is nothing left to release

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        cpu_start = time.thread_time()
        next_round = time.monotonic()
        while True:
            round_t = time.monotonic()
            for device in self._devices:
                if device.lost is None:
                    self._sample(device)
            with self._cond:
                self._last_round_t = round_t
                self._cpu_s = time.thread_time() - cpu_start
                self._cond.notify_all()
            if all(d.lost is not None for d in self._devices):
                return
            next_round = max(next_round + self.period_s, time.monotonic())  # no catch-up bursts
            if self._stop.wait(next_round - time.monotonic()):
                return

    def _sample(self, device: _Device) -> None:
        t = time.monotonic()
        try:
            sample = device.read(t)
        except _GpuLost as lost:
            with self._cond:
                device.lost = GpuLoss(t, str(lost))
            return
        with self._cond:
            device.samples.append(sample)

    @property
    def cpu_seconds(self) -> float:
        """CPU time the sampling thread has used so far (its own thread time)."""
        with self._cond:
            return self._cpu_s

    @staticmethod
    def mark() -> float:
        """A point in time on the samples' clock, to pass to summary()."""
        return time.monotonic()

    def traces(self) -> list[GpuTrace]:
        """A snapshot of everything sampled so far, one trace per GPU."""
        with self._cond:
            return [GpuTrace(d.index, d.name, tuple(d.samples), d.lost) for d in self._devices]

    def summaries(self, start: float, end: float) -> list[StepGpuSummary]:
        """One summary per GPU of the step [start, end]; empty when unavailable."""
        with self._cond:  # a reading after `end` lets energy and means cover the whole step
            self._cond.wait_for(lambda: self._last_round_t >= end or not self._running(),
                                timeout=max(2 * self.period_s, STUCK_ROUND_S))
        return [s for s in (summarize(trace, start, end) for trace in self.traces()) if s is not None]

    def summary(self, start: float, end: float, gpu: int | None = None) -> StepGpuSummary | None:
        """The step's summary for GPU `gpu`; by default the first GPU the pid was seen on, else GPU 0."""
        found = self.summaries(start, end)
        if gpu is not None:
            return next((s for s in found if s.gpu == gpu), None)
        return next((s for s in found if s.pid_on_gpu), found[0] if found else None)

    def summary_dict(self, start: float, end: float) -> dict[str, object]:
        """summary() as a dict for a record; all keys null when there is no GPU."""
        found = self.summary(start, end)
        return StepGpuSummary.null_dict() if found is None else found.to_dict()
