"""The option probes: for each option, a small request or two that shows whether it is in effect.

Probes cost a few hundred to ~3K tokens (prompts of random words), not a prefill of the profile's
size, and they watch the server only through channels that do not change what they check:
``/props`` and ``/metrics`` (they do not wake a sleeping server; ``GET /slots`` does and is never
called), the completion timings and the ``-lv 4`` log. How llama-server reuses prompts, and why each
probe looks where it does: docs/llama-server-reuse.md.
"""

from __future__ import annotations

import functools

from reusebench.check.context import Probe
from reusebench.check.probes.images import probe_mmproj_and_images
from reusebench.check.probes.launch import (
    probe_kv_unified,
    probe_logged_value,
    probe_lora,
    probe_lora_init_without_apply,
    probe_metrics,
    probe_parallel,
)
from reusebench.check.probes.lifecycle import probe_sleep_idle_seconds, probe_slot_save_path
from reusebench.check.probes.reuse import (
    probe_cache_idle_slots,
    probe_cache_prompt,
    probe_cache_ram,
    probe_cache_reuse,
    probe_checkpoint_min_step,
    probe_ctx_checkpoints,
    probe_slot_prompt_similarity,
    probe_swa_full,
)
from reusebench.check.probes.speculation import probe_spec_type

SLEEP_OPTION = "sleep-idle-seconds"
# Option -> probe, run in this order. Probes that change what later ones see come last: slot-save-path
# restarts the server, and sleeping empties every cache.
PROBES: dict[str, Probe] = {
    "parallel": probe_parallel,
    "kv-unified": probe_kv_unified,
    "mmproj": probe_mmproj_and_images,
    "ctx-size": functools.partial(probe_logged_value, what="n_ctx"),
    "batch-size": functools.partial(probe_logged_value, what="n_batch"),
    "ubatch-size": functools.partial(probe_logged_value, what="n_ubatch"),
    "threads": functools.partial(probe_logged_value, what="n_threads"),
    "metrics": probe_metrics,
    "lora": probe_lora,
    "lora-init-without-apply": probe_lora_init_without_apply,
    "cache-prompt": probe_cache_prompt,
    "ctx-checkpoints": probe_ctx_checkpoints,
    "checkpoint-min-step": probe_checkpoint_min_step,
    "slot-prompt-similarity": probe_slot_prompt_similarity,
    "cache-idle-slots": probe_cache_idle_slots,
    "cache-ram": probe_cache_ram,
    "cache-reuse": probe_cache_reuse,
    "swa-full": probe_swa_full,
    "spec-type": probe_spec_type,
    "slot-save-path": probe_slot_save_path,
    SLEEP_OPTION: probe_sleep_idle_seconds,
}
