"""What one server holds, as the reuse model keeps it: a slot's tokens and checkpoints (``Held``, ``Slot``), a
checkpoint (``Checkpoint``) and a RAM prompt-cache entry (``CacheEntry``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from reusebench.reuse.segments import Segments

# Why a request that keeps a slot restored from a file is not predicted with a draft model (``Slot.draft_behind``)
DRAFT_BEHIND_RESTORE = ("a draft model's context is not restored from a slot file (llama.cpp #28619): b11434 fails a "
                        "request that keeps the restored state")
# A prompt's ids as the model holds them: a tuple, or a replayed trace's runs of blocks (``segments``).
Ids = tuple[int, ...] | Segments


@dataclass(frozen=True)
class Checkpoint:
    n_tokens: int  # the state after this many tokens
    task: int  # the request that created it
    foreign: bool = False  # computed from other tokens than the ones it now sits under (kept across a restore)
    # The memory's lowest and highest position when it was taken (recurrent state: both n_tokens - 1; a window's
    # cache: its lowest cell), and the window's positions it holds.
    pos_min: int = -1
    pos_max: int = -1
    window: tuple[int, ...] = ()
    bytes: int = 0  # its partial state's size, as the RAM cache counts it (0: not measured)

    @classmethod
    def recurrent(cls, n_tokens: int, task: int, size: int = 0) -> Checkpoint:
        return cls(n_tokens, task, pos_min=n_tokens - 1, pos_max=n_tokens - 1, bytes=size)


@dataclass(frozen=True)
class Held:
    """What a slot or a RAM cache entry holds: tokens, checkpoints, and what its state was computed with."""

    tokens: Ids = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    computed_with: tuple[float, ...] | None = None  # adapter scales; None: mixed, matches nothing
    stale: bool = False  # a shifted chunk left removed tokens in the recurrent state
    window: tuple[int, ...] = ()  # a saved copy's window positions (a slot's own live in its cells)


@dataclass
class Slot:
    index: int
    held: Held = field(default_factory=Held)
    lora: tuple[float, ...] = ()
    t_last: int = -1
    draft_behind: bool = False  # restored from a file, which holds the target's context only: the draft's is not


@dataclass(frozen=True)
class CacheEntry:
    """A RAM prompt-cache entry: what it holds, the LoRA of the slot it was saved from, and its size as the cache
    counts it (the state's bytes and its checkpoints'; 0: not measured)."""

    held: Held
    lora: tuple[float, ...]
    bytes: int = 0


def kept_before(checkpoints: Sequence[Checkpoint], made: Checkpoint, *, limit: int, min_step: int) -> list[Checkpoint]:
    """The checkpoints a slot keeps as `made` is created (``create_checkpoint``): when full, earlier tasks' close
    ones thinned out, then the oldest dropped; a twin of `made` replaced."""
    kept: list[Checkpoint] = []
    last = -1
    for index, checkpoint in enumerate(checkpoints):
        full = len(kept) + len(checkpoints) - index + 1 >= limit
        if full and checkpoint.task != made.task and last >= 0 and checkpoint.n_tokens <= last + min_step:
            continue
        last = checkpoint.n_tokens
        kept.append(checkpoint)
    while len(kept) >= limit:
        kept.pop(0)
    return [c for c in kept if c.n_tokens != made.n_tokens]
