"""What llama-server applied at start-up, from its log: the configuration it really used (``startup_facts``: slots,
context, RAM cache, checkpoints, the options it turned off with a warning), the sizes it applied
(``applied_number``) and the KV caches it made (``kv_caches``). The options checker reads them; the model's memory is
``model_memory``'s."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reusebench.llama.logs import Event

# warnings that mean an option the user set was silently turned off
# Start-up lines (libllama INFO, visible at -lv 4) with the sizes the server applied: name -> the line, the
# number in group 1.
APPLIED_NUMBERS = {
    "n_ctx": re.compile(r"llama_context: n_ctx += (\d+)"),
    "n_batch": re.compile(r"llama_context: n_batch += (\d+)"),
    "n_ubatch": re.compile(r"llama_context: n_ubatch += (\d+)"),
    "n_threads": re.compile(r"system_info: n_threads = (\d+)"),
    "n_rs_seq": re.compile(r"llama_context: n_rs_seq += (\d+)"),  # how far a recurrent state can roll back
}


def applied_number(lines: Iterable[str], name: str) -> int | None:
    """The number the first start-up line for `name` (a key of ``APPLIED_NUMBERS``) states, or None."""
    for line in lines:
        if match := APPLIED_NUMBERS[name].search(line):
            return int(match.group(1))
    return None


@dataclass(frozen=True)
class KvCache:
    """One KV cache the context made, as its start-up lines state it (libllama INFO)."""

    window: bool  # the sliding-window layers' cache of an iSWA model
    cells: int
    layers: int
    mib: float


_ISWA_CACHE = re.compile(r"llama_kv_cache_iswa: creating +(non-SWA|SWA) KV cache, size = (\d+) cells")
_KV_SIZE = re.compile(r"llama_kv_cache: size = +(\d+\.\d+) MiB \( *(\d+) cells, +(\d+) layers")


def kv_caches(lines: Iterable[str]) -> list[KvCache]:
    """The KV caches the lines state (read them from one start), each with its cells, layers and MiB; an iSWA
    model's two say which is the window's."""
    found: list[KvCache] = []
    window = False
    for line in lines:
        if iswa := _ISWA_CACHE.search(line):
            window = iswa.group(1) == "SWA"
        elif size := _KV_SIZE.search(line):
            found.append(KvCache(window, int(size.group(2)), int(size.group(3)), float(size.group(1))))
            window = False
    return found


_DISABLED_OPTION_KINDS = frozenset({
    "cache_reuse_unsupported", "ctx_shift_unsupported", "swa_full_unsupported", "cache_idle_slots_need_cache_ram",
})


def startup_facts(events: Iterable[Event]) -> dict[str, Any]:
    """What the server really configured, from its startup lines. Later values win (a wake repeats them).

    Keys: ``disabled_options`` (list of {kind, reason, level, line}), ``n_slots``, ``n_ctx_slot``, ``kv_unified``,
    ``prompt_cache_enabled``, ``prompt_cache_limit_mib`` (None: unlimited or disabled), ``checkpoints_max``
    (0 when disabled), ``checkpoints_min_spacing``, ``multimodal_loaded``, ``n_parallel_auto`` (``-np`` auto gave
    4 unified slots), ``idle_slots_saved`` / ``idle_slots_cleared`` (``--cache-idle-slots`` in effect, and whether
    unified KV makes it clear them too). A key is None when its line was not seen.
    """
    facts: dict[str, Any] = dict.fromkeys(
        ("n_slots", "n_ctx_slot", "kv_unified", "prompt_cache_enabled", "prompt_cache_limit_mib",
         "checkpoints_max", "checkpoints_min_spacing"))
    facts.update(disabled_options=[], multimodal_loaded=False, n_parallel_auto=False, idle_slots_saved=False,
                 idle_slots_cleared=False)
    seen_warnings: set[str] = set()
    for e in events:
        f = e.fields
        if e.kind in _DISABLED_OPTION_KINDS and e.line not in seen_warnings:
            seen_warnings.add(e.line)
            facts["disabled_options"].append({"kind": e.kind, "reason": f.get("reason"), "level": e.level, "line": e.line})
        elif e.kind == "slots_initialized":
            facts.update(n_slots=f["n_slots"], n_ctx_slot=f["n_ctx_slot"], kv_unified=f["kv_unified"] == "true")
        elif e.kind == "prompt_cache_enabled":
            facts.update(prompt_cache_enabled=True, prompt_cache_limit_mib=f.get("limit_mib"))
        elif e.kind == "prompt_cache_disabled":
            facts.update(prompt_cache_enabled=False, prompt_cache_limit_mib=None)
        elif e.kind == "checkpoints_enabled":
            facts.update(checkpoints_max=f["max"], checkpoints_min_spacing=f["min_spacing"])
        elif e.kind == "checkpoints_disabled":
            facts.update(checkpoints_max=0, checkpoints_min_spacing=None)
        elif e.kind == "multimodal_loaded":
            facts["multimodal_loaded"] = True
        elif e.kind == "idle_slots_policy":
            facts.update(idle_slots_saved=True, idle_slots_cleared="and_cleared" in f)
        elif e.kind == "n_parallel_auto":
            facts["n_parallel_auto"] = True
    return facts
