"""Per-request attribution: why one request reused what it did, from the log events (``logs``) it caused."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from reusebench.llama.logs import Event


@dataclass(frozen=True)
class Cause:
    """Why one request reused what it did, read from the events logged while it ran.

    ``summary`` is a short human sentence picked by the first rule of ``_SUMMARY_RULES`` that applies; the other
    fields are the structured evidence (None / False / empty when the log did not say).
    """

    summary: str
    slot: int | None = None
    task: int | None = None
    selection: str | None = None  # "id" | "lcp" | "lru"
    slot_was_empty: bool = False  # LRU picked a never-used slot (t_last = -1)
    f_sim: float | None = None  # from the LCP selection line
    f_keep: float | None = None
    ram_restored: bool = False  # "found better prompt": the slot was loaded from the RAM prompt cache
    ram_f_keep: float | None = None
    ram_f_sim: float | None = None
    ram_saved_n_tokens: tuple[int, ...] = ()  # slot contents saved to RAM before the request took the slot
    ram_evicted_mib: tuple[float, ...] = ()  # RAM cache entries dropped (making room, over the size or token limit)
    ram_skipped_too_large: bool = False  # a state bigger than the whole RAM cache was not saved (it is lost)
    checkpoint_n_tokens: int | None = None  # the context checkpoint that was restored
    forced_full: bool = False  # no usable checkpoint before the divergence (hybrid/SWA memory)
    lora_clear: bool = False  # "clearing cache for lora change"
    lora_clear_after_ram_restore: bool = False  # report B: a just-restored RAM state thrown away
    woke: bool = False
    slept: bool = False
    cache_reuse_chunks: tuple[int, ...] = ()  # sizes of chunks moved by --cache-reuse KV shifting
    cache_reuse_ignored: bool = False
    cached_n_tokens: int | None = None  # first "n_tokens = N, memory_seq_rm" line: equals timings.cache_n
    prompt_n: int | None = None  # tokens evaluated, from "prompt eval time"
    n_tokens_after: int | None = None  # slot size after the request ("stop processing")
    checkpoints_created: tuple[int, ...] = ()  # n_tokens of the checkpoints this request created
    slots_purged: tuple[int, ...] = ()
    images_encoded: int = 0  # images the vision tower encoded for this request
    image_encode_ms: float | None = None  # how long the encodes took (the log's timestamps), and the decode of
    image_decode_ms: float | None = None  # their tokens into the model (its own lines)
    drafts: int = 0  # speculative drafts the target verified (LLAMA_TRACE lines; a replay is not a draft)
    drafts_rolled_back: int = 0  # ... of them with a token rejected: the state went back to the draft's start
    spec_checkpoints_restored: int = 0  # ... of those, undone from a speculative checkpoint (not rolled back in place)

    def to_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# How each event kind fills Cause fields: (Cause field, event field, mode). Modes: "first"/"last" keep one value,
# "append" collects a tuple, "flag" sets True (event field unused).
_CAUSE_UPDATES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "slot_selected_by_lcp": (("f_sim", "f_sim", "last"), ("f_keep", "f_keep", "last")),
    "ram_prompt_found": (("ram_restored", "", "flag"), ("ram_f_keep", "f_keep", "last"), ("ram_f_sim", "f_sim", "last")),
    "ram_prompt_saved": (("ram_saved_n_tokens", "n_tokens", "append"),),
    "ram_entry_evicted_for_room": (("ram_evicted_mib", "size_mib", "append"),),
    "ram_entry_evicted_over_limit": (("ram_evicted_mib", "size_mib", "append"),),
    "ram_entry_evicted_over_token_limit": (("ram_evicted_mib", "size_mib", "append"),),
    "ram_prompt_too_large": (("ram_skipped_too_large", "", "flag"),),
    "checkpoint_restored": (("checkpoint_n_tokens", "n_tokens", "last"),),
    "checkpoint_created": (("checkpoints_created", "n_tokens", "append"),),
    "forced_full_reprocess": (("forced_full", "", "flag"),),
    "lora_cache_cleared": (("lora_clear", "", "flag"),),
    "sleep_entering": (("slept", "", "flag"),),
    "sleep_exiting": (("woke", "", "flag"),),
    "cache_reuse_chunk": (("cache_reuse_chunks", "size", "append"),),
    "cache_reuse_ignored": (("cache_reuse_ignored", "", "flag"),),
    "cached_tokens": (("cached_n_tokens", "n_tokens", "first"),),  # one line per batch; the first is cache_n
    "prompt_eval": (("prompt_n", "n_tokens", "last"),),
    "stop_processing": (("n_tokens_after", "n_tokens", "last"),),
    "slot_purged": (("slots_purged", "purged_slot", "append"),),
}
RAM_EVICTION_KINDS = frozenset({"ram_entry_evicted_for_room", "ram_entry_evicted_over_limit",
                                "ram_entry_evicted_over_token_limit"})
_SELECTION_BY_KIND = {"slot_selected_by_id": "id", "slot_selected_by_lcp": "lcp", "slot_selected_by_lru": "lru"}


def _ram_found(c: Cause) -> str:
    return f"found in RAM cache (f_keep={c.ram_f_keep:.3f}, f_sim={c.ram_f_sim:.3f})"


# Precedence, first match wins. Why this order:
# 1. waking reloads the model with empty slots and RAM cache, so nothing logged after it can be reuse of old work;
# 2. a LoRA clear discards whatever was restored before it; when that was a RAM restore it is report B's bug
#    ("found better prompt" then "clearing cache for lora change"), so it outranks a plain LoRA clear;
# 3. a cache-reuse shift followed by a checkpoint restore is --cache-reuse left active on a hybrid (the restored
#    recurrent state does not match the shifted attention cache; docs/llama-server-reuse.md, "--cache-reuse (KV
#    shifting)"): it must not read as an ordinary checkpoint hit;
# 4. a forced full re-processing outranks the RAM restore that may precede it (the restore bought nothing);
# 5. then the reuse path actually taken: checkpoint, RAM entry, chunk shift, tokens kept in the slot, nothing.
_SUMMARY_RULES: tuple[tuple[Callable[[Cause], object], Callable[[Cause], str]], ...] = (
    (lambda c: c.woke, lambda c: "woke from sleep (model reloaded, slots and RAM cache empty)"),
    (lambda c: c.lora_clear_after_ram_restore, lambda c: "LoRA-change clear after restoring from RAM"),
    (lambda c: c.lora_clear, lambda c: "LoRA-change clear"),
    (lambda c: c.cache_reuse_chunks and c.checkpoint_n_tokens is not None,
     lambda c: f"cache-reuse shifted chunk then restored checkpoint at n_tokens={c.checkpoint_n_tokens}"),
    (lambda c: c.forced_full and c.ram_restored,
     lambda c: f"{_ram_found(c)}, then forced full re-processing (no checkpoint before divergence)"),
    (lambda c: c.forced_full, lambda c: "forced full re-processing (no checkpoint before divergence)"),
    (lambda c: c.checkpoint_n_tokens is not None and c.ram_restored,
     lambda c: f"{_ram_found(c)}, restored checkpoint at n_tokens={c.checkpoint_n_tokens}"),
    (lambda c: c.checkpoint_n_tokens is not None, lambda c: f"restored checkpoint at n_tokens={c.checkpoint_n_tokens}"),
    (lambda c: c.ram_restored, _ram_found),
    (lambda c: c.cache_reuse_chunks, lambda c: f"cache-reuse shifted {len(c.cache_reuse_chunks)} chunk(s)"),
    (lambda c: c.cached_n_tokens, lambda c: f"kept {c.cached_n_tokens} tokens in slot"),
    (lambda c: c.slot_was_empty, lambda c: "no reuse (empty slot)"),
    (lambda c: c.selection is not None or c.task is not None, lambda c: "no reuse"),
)


def explain(events: Iterable[Event]) -> Cause:
    """The cause for the events logged during one request (read from just before it to just after its response).

    The request's slot and task come from its selection line and the first ``processing task`` line; with requests
    sent one at a time every other event in the window belongs to it or to the cache work it triggered.
    """
    values: dict[str, Any] = {}
    encoding_at: float | None = None  # the last encode that has not reached its decode yet
    replay_next = False  # a draft restored from a speculative checkpoint: its accepted tokens are evaluated again
    for e in events:
        if e.kind == "draft_restored_checkpoint":
            values["spec_checkpoints_restored"] = values.get("spec_checkpoints_restored", 0) + 1
        if e.kind in ("draft_verified", "draft_restored_checkpoint"):
            if not replay_next:
                values["drafts"] = values.get("drafts", 0) + 1
                rejected = int(e.fields["accepted"]) < int(e.fields["drafted"])
                values["drafts_rolled_back"] = values.get("drafts_rolled_back", 0) + rejected
            replay_next = e.kind == "draft_restored_checkpoint"
        if e.kind == "mtmd_encoding":
            values["images_encoded"] = values.get("images_encoded", 0) + int(e.fields["n_chunks"])
            encoding_at = e.at_s
        elif e.kind == "image_decoding" and encoding_at is not None and e.at_s is not None:
            values["image_encode_ms"] = values.get("image_encode_ms", 0.0) + (e.at_s - encoding_at) * 1000.0
            encoding_at = None
        elif e.kind == "image_decoded":
            values["image_decode_ms"] = values.get("image_decode_ms", 0.0) + float(e.fields["ms"])
        if e.kind in _SELECTION_BY_KIND:
            values.update(selection=_SELECTION_BY_KIND[e.kind], slot=e.slot, slot_was_empty=e.fields.get("t_last") == -1)
        elif e.kind == "processing_task" and "task" not in values:
            values.update(slot=e.slot, task=e.task)
        elif e.kind == "lora_cache_cleared":
            # order matters: only a clear *after* a RAM restore discards restored work
            values["lora_clear_after_ram_restore"] = values.get("ram_restored", False)
        for name, key, mode in _CAUSE_UPDATES.get(e.kind, ()):
            if mode == "flag":
                values[name] = True
            elif mode == "append":
                values[name] = values.get(name, ()) + (e.fields[key],)
            elif mode == "last" or name not in values:
                values[name] = e.fields[key]
    draft = Cause(summary="", **values)
    summary = next((text(draft) for applies, text in _SUMMARY_RULES if applies(draft)), "no request in log")
    return replace(draft, summary=summary)
