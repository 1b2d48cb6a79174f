"""Host state next to each measurement: CPU, load, memory, and whether the model file was cached.

Linux sources (/proc, /sys, mincore); anything a platform lacks is None rather than an error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class HostState:
    cpu_model: str | None
    cpu_count: int | None
    cpu_mhz_mean: float | None  # current frequency, mean over cores
    load_avg_1m: float | None
    load_avg_5m: float | None
    load_avg_15m: float | None
    mem_total_mib: float | None
    mem_available_mib: float | None
    model_path: str | None
    model_page_cache_fraction: float | None  # of the model file, before the server loads it

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


LOAD_MARGIN = 0.5  # runnable tasks beyond one per core before a timing is flagged


def under_load(host: dict[str, Any] | None) -> str | None:
    """Why a step's timing is suspect, from the host state recorded before it: a 1-minute load average above one
    task per core plus ``LOAD_MARGIN``. The suite's own server keeps about one task per core busy (a quiet
    2-core machine read 1.87-2.07 through make bench); other work on top shows (3.7-4.1 beside a compile)."""
    if not host or not host.get("load_avg_1m") or not host.get("cpu_count"):
        return None
    load, cores = float(host["load_avg_1m"]), int(host["cpu_count"])
    return f"load average {load:.2f} on {cores} cores before the step" if load > cores + LOAD_MARGIN else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _cpuinfo_values(key: str) -> list[str]:
    text = _read(PROC / "cpuinfo") or ""
    return [v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if k.strip() == key]


def cpu_model() -> str | None:
    models = _cpuinfo_values("model name")
    return models[0] if models else None


# Instruction-set extensions that llama.cpp's CPU kernels are compiled for, by /proc/cpuinfo
# flag name. A native build uses those of the machine that built it, with no runtime check.
KERNEL_CPU_FEATURES: dict[str, tuple[str, ...]] = {
    "x86_64": ("avx", "avx2", "fma", "f16c", "bmi2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
               "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"),
    "aarch64": ("asimd", "asimddp", "i8mm", "sve", "sve2", "bf16", "fphp"),
}


def missing_cpu_features(machine: str | None = None) -> list[str]:
    """The kernel extensions this CPU lacks (x86 'flags' / arm 'Features' of /proc/cpuinfo)."""
    machine = machine or os.uname().machine
    present = set(" ".join(_cpuinfo_values("flags") or _cpuinfo_values("Features")).split())
    return [name for name in KERNEL_CPU_FEATURES.get(machine, ()) if name not in present]


def cpu_mhz_mean() -> float | None:
    """Mean current CPU frequency: cpufreq's scaling_cur_freq (kHz), else /proc/cpuinfo's 'cpu MHz'."""
    khz = [_read(p) for p in SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_cur_freq")]
    mhz = [int(k) / 1000 for k in khz if k and k.strip().isdigit()]
    if not mhz:
        mhz = [float(v) for v in _cpuinfo_values("cpu MHz")]
    return sum(mhz) / len(mhz) if mhz else None


def meminfo_mib() -> dict[str, float]:
    """/proc/meminfo in MiB (its values are kB)."""
    fields: dict[str, float] = {}
    for line in (_read(PROC / "meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) / 1024
    return fields


def _load_mincore() -> Callable[..., int] | None:
    libc_name = ctypes.util.find_library("c")
    mincore = getattr(ctypes.CDLL(libc_name, use_errno=True), "mincore", None) if libc_name else None
    if mincore is not None:
        mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        mincore.restype = ctypes.c_int
    return mincore


_MINCORE = _load_mincore()
_RESIDENT_BIT = bytes(b & 1 for b in range(256))  # mincore: only the lowest bit is defined


def page_cache_fraction(path: Path) -> float | None:
    """Fraction of the file's pages resident in the page cache; None if it cannot be told.

    Maps the file and asks mincore(2), which reads no page, so asking does not warm the cache.
    """
    if _MINCORE is None:
        return None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            # A private mapping can be exported to ctypes (a read-only one cannot); nothing writes to it.
            mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with mapping:
        anchor = ctypes.c_char.from_buffer(mapping)
        status = _MINCORE(ctypes.addressof(anchor), size, vec)
        del anchor  # the mapping cannot close while ctypes holds it
    if status != 0:
        return None
    return bytes(vec).translate(_RESIDENT_BIT).count(1) / pages


def capture(model_path: Path | None = None) -> HostState:
    """The host's state now; call before the server starts so the page-cache figure means something."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    mem = meminfo_mib()
    return HostState(
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        cpu_mhz_mean=cpu_mhz_mean(),
        load_avg_1m=load[0],
        load_avg_5m=load[1],
        load_avg_15m=load[2],
        mem_total_mib=mem.get("MemTotal"),
        mem_available_mib=mem.get("MemAvailable"),
        model_path=None if model_path is None else str(model_path),
        model_page_cache_fraction=None if model_path is None else page_cache_fraction(model_path),
    )
