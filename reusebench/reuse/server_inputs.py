"""What the reuse model is told about one server, apart from its history: the model's memory (``Memory``, from
what the server built: ``memory_of``) and the launch options that decide reuse, read as the server reads them
(``Launch``, ``launch_of_options``), with what follows from the two alone (a window's cells, whether the memory can
shift, whether --cache-reuse stays on). ``reuse.expectation`` runs the rules over them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reusebench.capability.state_bytes import StateBytes
from reusebench.config import options as options_mod
from reusebench.llama import arch_source
from reusebench.llama.facts import (
    AUTO_SLOTS,
    DEFAULT_BATCH,
    DEFAULT_CACHE_RAM_MIB,
    DEFAULT_CHECKPOINT_MIN_STEP,
    DEFAULT_CTX_CHECKPOINTS,
    DEFAULT_SLOT_PROMPT_SIMILARITY,
    DEFAULT_UBATCH,
)
from reusebench.llama.memory_log import ModelMemory
from reusebench.reuse import swa

MEMORY_KINDS = ("attention", "recurrent", "hybrid", "swa")


@dataclass(frozen=True)
class Memory:
    """What a model's context memory can do, as far as prompt reuse goes."""

    kind: str  # one of MEMORY_KINDS
    can_shift: bool  # its attention cache can shift positions (what --cache-reuse needs)
    window: int = 0  # the sliding window of its SWA layers (n_swa), 0 without
    window_layers: int = 0  # how many of its layers keep only the window
    not_modelled: str = ""  # why the rules below do not predict this memory's counts ("" when they do)
    chunked: bool = False  # its window is the current chunk of `window` tokens (llama4), not the last `window`
    state: StateBytes | None = None  # a slot's state in bytes, as the RAM cache counts it; None: not measured

    @property
    def needs_checkpoints(self) -> bool:
        """Recurrent state cannot be cut at any position, and a window's cache has dropped what came before it:
        only checkpoints take either back."""
        return self.kind != "attention"


def memory_of(built: ModelMemory, state: StateBytes | None = None) -> Memory:
    """The memory the server built (``llama.memory_log``), as the model's rules see it, with its state's bytes
    where they were measured (``capability.state_bytes``). A layout the rules do not cover keeps its nearest kind,
    for the plan's estimates, and says why it is not modelled."""
    if built.recurrent and built.attention_layers:
        kind = "hybrid"  # with a window too (lfm2): the recurrent state's position is the memory's lowest
    elif built.recurrent:
        kind = "recurrent"
    else:
        kind = "swa" if built.window_layers else "attention"
    return Memory(kind, built.can_shift, built.window, built.window_layers, built.not_modelled,
                  chunked=built.window_type == arch_source.CHUNKED, state=state)


@dataclass(frozen=True)
class Launch:
    """The launch options that decide reuse, with llama-server's defaults."""

    n_batch: int = DEFAULT_BATCH
    n_ubatch: int = DEFAULT_UBATCH
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    checkpoint_min_step: int = DEFAULT_CHECKPOINT_MIN_STEP
    cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB
    cache_reuse: int = 0
    n_slots: int = AUTO_SLOTS
    kv_unified: bool = True
    slot_prompt_similarity: float = DEFAULT_SLOT_PROMPT_SIMILARITY
    cache_idle_slots: bool = True
    cache_prompt: bool = True
    multimodal: bool = False
    lora_adapters: int = 0
    n_ctx: int = 0  # --ctx-size; 0: not known, then a slot's context bounds nothing
    swa_full: bool = False
    # speculative decoding on (--spec-type other than none, or a draft model): b11434 streams a token's
    # probabilities only for the first token of each accepted draft (llama.cpp #27196), so its calls go unstreamed
    speculative: bool = False
    draft_model: bool = False  # a second model drafts (--spec-draft-model), in a context of its own

    @property
    def n_streams(self) -> int:
        """KV cache streams: one shared by every slot with unified KV, else one each."""
        return 1 if self.kv_unified else self.n_slots

    @property
    def total_ctx(self) -> int:
        """The context the server holds in all (``llama_n_ctx``): each stream's padded slot context, once with
        unified KV. -c 768 with 2 slots of their own is 2 x 512 = 1,024."""
        return self.slot_ctx * self.n_streams

    @property
    def slot_ctx(self) -> int:
        """A slot's context as the server sizes it: all of it with unified KV, else its share, padded to 256."""
        n_ctx = swa.pad(self.n_ctx)
        return n_ctx if self.kv_unified else swa.pad(n_ctx // self.n_slots)


def launch_of_options(options: Mapping[str, object], *, multimodal: bool = False, lora_adapters: int = 0,
                      n_ctx: int = 0) -> Launch:
    """A variant's options (long names, as in a profile) read as the server reads them; `n_ctx` is the context the
    harness gives when the options set none."""
    def number(name: str, default: float) -> float:
        return float(options_mod.number(options, name, default))  # type: ignore[arg-type]

    parallel = int(number("parallel", -1))
    n_ctx = int(number("ctx-size", n_ctx))
    n_batch = int(number("batch-size", DEFAULT_BATCH))
    if n_ctx:
        n_batch = min(n_batch, n_ctx)  # the context clamps the batch to itself
    cache_ram = int(number("cache-ram", DEFAULT_CACHE_RAM_MIB))
    return Launch(
        n_batch=n_batch,
        n_ubatch=min(n_batch, int(number("ubatch-size", DEFAULT_UBATCH))),  # the context clamps ubatch to batch
        ctx_checkpoints=int(number("ctx-checkpoints", number("swa-checkpoints", DEFAULT_CTX_CHECKPOINTS))),
        checkpoint_min_step=int(number("checkpoint-min-step", DEFAULT_CHECKPOINT_MIN_STEP)),
        cache_ram_mib=cache_ram,
        cache_reuse=int(number("cache-reuse", 0)),
        n_slots=AUTO_SLOTS if parallel < 0 else parallel,
        kv_unified=parallel < 0 or (bool(options.get("kv-unified")) and not options.get("no-kv-unified")),
        slot_prompt_similarity=number("slot-prompt-similarity", DEFAULT_SLOT_PROMPT_SIMILARITY),
        # --cache-idle-slots turns itself off without a RAM cache
        cache_idle_slots=cache_ram != 0 and not options.get("no-cache-idle-slots")
        and options.get("cache-idle-slots") is not False,
        cache_prompt=not options.get("no-cache-prompt") and options.get("cache-prompt") is not False,
        multimodal=multimodal,
        lora_adapters=lora_adapters,
        n_ctx=n_ctx,
        swa_full=bool(options.get("swa-full")),
        speculative=str(options.get("spec-type", "none")) != "none" or options.get("spec-draft-model") is not None,
        # with --spec-type none the draft model is loaded and never drafts (b11434: no draft context in use)
        draft_model=options.get("spec-draft-model") is not None and str(options.get("spec-type", "")) != "none",
    )


def window_cells(memory: Memory, launch: Launch) -> int:
    """The cells of a window's cache per stream (``swa.window_cells``); a slot's context when nothing bounds it."""
    n_ctx = launch.n_ctx or swa.pad(memory.window * launch.n_slots + launch.n_ubatch) * launch.n_slots
    return swa.window_cells(n_ctx, memory.window, launch.n_ubatch, launch.n_slots, launch.kv_unified, launch.swa_full)


def can_shift(memory: Memory, launch: Launch) -> bool:
    """Whether the memory can shift positions: a window's cache (also a hybrid's) only when it is as large as the
    full one."""
    if not memory.window:
        return memory.can_shift
    return memory.can_shift and launch.n_ctx > 0 and window_cells(memory, launch) == launch.slot_ctx


def active_cache_reuse(memory: Memory, launch: Launch) -> int:
    """--cache-reuse as the server applies it: forced to 0 with an mmproj, or when the memory cannot shift."""
    return 0 if launch.multimodal or not can_shift(memory, launch) else launch.cache_reuse
