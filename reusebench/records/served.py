"""Where a request's reused state came from: one vocabulary for what the reuse model predicts (``reuse.expectation``)
and what the server's log shows (a record's ``cause``), so a prediction's misses by class and a replay's line up."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Served(StrEnum):
    WOKE = "woke from sleep"  # the server slept since: its slots and RAM cache were emptied
    LORA_CLEAR = "LoRA clear"  # another adapter set cleared the slot (or what the RAM cache had just given back)
    SLOT_KEPT = "slot kept"  # the slot picked by prompt similarity kept its state
    RAM_CACHE = "RAM cache"  # the state came back from the RAM cache
    CHECKPOINT = "checkpoint"  # a checkpoint was restored, or none lay before the divergence (forced full)
    EVICTED = "evicted"  # nothing held for it, and a RAM cache was on: what was held was pushed out
    NOT_HELD = "not held"  # nothing held for it, and no RAM cache to keep it


def served(*, checkpoint: bool, ram_restored: bool, similar_slot: bool, ram_cache: bool, woke: bool = False,
           lora_clear: bool = False) -> Served:
    """The class, by the facts both sides know: in this order, as a wake empties everything, a LoRA clear throws
    away whatever was found, and a checkpoint decides what a restored or kept state is worth."""
    if woke:
        return Served.WOKE
    if lora_clear:
        return Served.LORA_CLEAR
    if checkpoint:
        return Served.CHECKPOINT
    if ram_restored:
        return Served.RAM_CACHE
    if similar_slot:
        return Served.SLOT_KEPT
    return Served.EVICTED if ram_cache else Served.NOT_HELD


def served_by_log(cause: Mapping[str, Any] | None, ram_cache: bool) -> Served:
    """The class of a record by its log's cause (``llama.causes.explain``)."""
    cause = cause or {}
    return served(checkpoint=bool(cause.get("forced_full")) or cause.get("checkpoint_n_tokens") is not None,
                  ram_restored=bool(cause.get("ram_restored")), similar_slot=cause.get("selection") == "lcp",
                  ram_cache=ram_cache, woke=bool(cause.get("woke")), lora_clear=bool(cause.get("lora_clear")))
