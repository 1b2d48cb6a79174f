"""A model's memory as llama-server built it, read from its startup log: ``ModelMemory``.

A GGUF's keys are a weak witness of what the server will build: llama.cpp reads only the keys its architecture
knows (a file written by ``test-llama-archs`` carries the same generic ``ssm.*`` and ``sliding_window`` keys for
every architecture), and real LFM2 files have ``shortconv`` keys where a guess looks for ``ssm``. The server says
what it built, once, at startup, and every line used here is a libllama INFO line of numbers:

- ``print_info: arch``, ``n_layer``, ``n_ctx_train``, ``n_head_kv`` (one number, or one per layer with 0 for a
  layer without attention), ``n_swa`` and ``is_swa_any`` (the window), ``rope type`` (multi-position RoPE
  cannot shift);
- ``llama_kv_cache: size = ... (C cells, L layers, ...)``: each attention cache and its layers; after
  ``llama_kv_cache_iswa: creating SWA KV cache`` it is the window's;
- ``llama_memory_recurrent: size = ...``: some layers keep a recurrent (or convolution) state;
- ``NAME: creating WHAT KV cache``: every other cache the build makes (an indexer, DSA, ...);
- ``cache_reuse is not supported by this context``: the context cannot shift positions (the probe launches with
  ``--cache-reuse`` and ``--swa-full`` so that the server answers for the model itself, not for a window's size).

The window's type (standard, chunked, symmetric) is not printed; it comes from the build's source
(``llama.arch_source``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from reusebench.llama import arch_source

# Caches whose reuse rules the reuse model follows; any other a build makes leaves the model "not modelled".
MODELLED_CACHES = frozenset({"llama_kv_cache_iswa: non-SWA", "llama_kv_cache_iswa: SWA",
                             "llama_memory_hybrid_idx: indexer"})

_INFO = re.compile(r"print_info: (arch|n_layer|n_ctx_train|n_head_kv|n_swa|is_swa_any|rope type) += +(.+?)\s*$")
_KV = re.compile(r"llama_kv_cache: size = +[\d.]+ MiB \( *(\d+) cells, +(\d+) layers")
_RECURRENT = re.compile(r"llama_memory_recurrent: size = +[\d.]+ MiB \( *(\d+) cells, +(\d+) layers")
_CREATING = re.compile(r"(llama_\w+): creating +(.+?) (?:KV cache|compressor state)\b")
_NO_SHIFT = re.compile(r"cache_reuse is not supported by this context")
MULTI_POSITION_ROPE = (8, 24, 40)  # LLAMA_ROPE_TYPE_MROPE, _VISION, _IMROPE: positions in sections


class MemoryLogError(ValueError):
    """A startup log that does not say what the model's memory is; the message names the missing line."""


@dataclass(frozen=True)
class ModelMemory:
    """What the server built for one model, as its startup log states it."""

    arch: str
    n_layer: int
    n_ctx_train: int
    attention_layers: int  # layers that keep keys and values (n_head_kv > 0)
    recurrent: bool  # some layers keep a recurrent or convolution state (its log line counts every layer)
    window: int  # n_swa where some layer has a window, else 0
    window_layers: int  # the layers whose cache keeps only the window
    window_type: str  # "standard", "chunked", "symmetric", "" without a window, "unknown" when the source is silent
    rope_type: int
    can_shift: bool  # the context can shift positions (what --cache-reuse needs)
    caches: tuple[str, ...] = ()  # every cache the build said it made beside the plain ones ("NAME: WHAT")

    @property
    def family(self) -> str:
        """attention, windowed attention, recurrent, hybrid, windowed hybrid: the words of the docs' table."""
        windowed = "windowed " if self.window_layers else ""
        if self.recurrent and self.attention_layers:
            return f"{windowed}hybrid"
        if self.recurrent:
            return "recurrent"
        return f"{windowed}attention"

    @property
    def not_modelled(self) -> str:
        """Why the reuse model cannot predict this memory's counts ("" when it can)."""
        unknown = sorted({c.split(":")[0] for c in self.caches if c not in MODELLED_CACHES})
        if unknown:
            return f"{self.arch}: its {', '.join(unknown)} caches are not modelled"
        if self.window_layers and self.window_type not in (arch_source.STANDARD, arch_source.CHUNKED):
            return f"{self.arch}: a {self.window_type} window is not modelled"
        if not self.attention_layers and not self.recurrent:
            return f"{self.arch}: no attention or recurrent cache"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelMemory:
        return cls(**{**data, "caches": tuple(data.get("caches", ()))})


def _numbers(value: str) -> list[int]:
    return [int(v) for v in re.findall(r"-?\d+", value)]


def from_startup(lines: Iterable[str], table: Mapping[str, str]) -> ModelMemory:
    """The memory one start's lines state; `table` gives the window type per architecture
    (``arch_source.WINDOW_TYPES`` or a build's own)."""
    info: dict[str, str] = {}
    attention_cache_layers: list[tuple[bool, int]] = []  # (window's, layers)
    recurrent = False
    caches: list[str] = []
    window_next = False
    can_shift = True
    for line in lines:
        if found := _INFO.search(line):
            info.setdefault(found.group(1), found.group(2))
        elif found := _CREATING.search(line):
            caches.append(f"{found.group(1)}: {found.group(2).strip()}")
            window_next = found.group(1) == "llama_kv_cache_iswa" and found.group(2).strip() == "SWA"
        elif found := _KV.search(line):
            attention_cache_layers.append((window_next, int(found.group(2))))
            window_next = False
        elif found := _RECURRENT.search(line):
            recurrent = True
        elif _NO_SHIFT.search(line):
            can_shift = False
    for key in ("arch", "n_layer", "n_head_kv", "rope type"):
        if key not in info:
            raise MemoryLogError(f"the startup log has no 'print_info: {key}' line")
    arch = info["arch"]
    n_layer = _numbers(info["n_layer"])[0]
    heads = _numbers(info["n_head_kv"])
    window_layers = sum(layers for windowed, layers in attention_cache_layers if windowed)
    swa_any = _numbers(info.get("is_swa_any", "0"))[0] > 0
    window = _numbers(info.get("n_swa", "0"))[0] if swa_any else 0
    if attention_cache_layers or recurrent:  # the caches say which layers keep keys (a KV-sharing layer keeps none)
        attention_layers = sum(layers for _, layers in attention_cache_layers)
    else:  # a build that prints no cache lines: the layers with key heads
        attention_layers = sum(h > 0 for h in heads) if len(heads) > 1 else (n_layer if heads and heads[0] else 0)
    rope_type = _numbers(info["rope type"])[0]
    return ModelMemory(
        arch=arch,
        n_layer=n_layer,
        n_ctx_train=_numbers(info.get("n_ctx_train", "0"))[0],
        attention_layers=attention_layers,
        recurrent=recurrent,
        window=window if window_layers else 0,
        window_layers=window_layers,
        window_type=(table.get(arch, "unknown") if window_layers else ""),
        rope_type=rope_type,
        can_shift=can_shift and rope_type not in MULTI_POSITION_ROPE,
        caches=tuple(dict.fromkeys(caches)),
    )
