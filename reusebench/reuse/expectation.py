"""What a llama-server build should re-process for a request, and why: a model of its prompt reuse.

The model is pure: it keeps the history of one server (slots, their checkpoints, the RAM cache, slot files), is fed
the requests the server is, as token ids, and predicts ``prompt_n`` with its cause before the server's answer is looked
at; the answer contributes only its generated tokens (``answered``). Every rule is in docs/llama-server-reuse.md.

What the model is told (``reuse.server_inputs``): the model's memory as its server built it (``memory_of`` over
``llama.memory_log.ModelMemory``: attention, recurrent, hybrid or sliding-window, the window, whether its attention cache
can shift), the launch options that decide reuse (``launch_of_options``), and the build's capabilities as its probes
showed them (``reusebench.capability``; b11434's where nothing was probed). It is not told what the measured server
logged about its options: a build that quietly changes a rule no probe covers must show as a step the model did not
expect. A sliding-window model's window cache is replayed cell by cell (``reuse.swa``).

The RAM cache's limits are held as the server holds them: its size in bytes (each entry's state and checkpoints, as
measured for the model by ``capability.state_bytes``) and its token limit (the context, raised to what the size holds at
the cache's bytes per token). Where the state's bytes were not measured, a size limit is not modelled.

Images (``reuse.image_runs``): an image is a run of ids of its own, matched whole or not at all and prefilled as one
chunk; a text batch stops where one begins, and the batch after images gets no checkpoint ("do not checkpoint after mtmd
chunks"). Not modelled: an image whose positions are not its tokens (b11434 logs them equal for the tiny projector),
aLoRA, a draft model's context after a restore from a file (``Expected.not_modelled``), the memories
``ModelMemory.not_modelled`` names. Speculation changes no count otherwise: the speculative checkpoints are the slot's
own, and a draft context drops and re-processes what the target does (docs/llama-server-reuse.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from reusebench.capability import Capabilities
from reusebench.llama.facts import F_KEEP_SAVE, end_checkpoint_offsets
from reusebench.records import Served, served
from reusebench.reuse import swa
from reusebench.reuse.prompt_cache import PromptCache
from reusebench.reuse.segments import Segments, common_prefix, shared_run
from reusebench.reuse.server_inputs import Launch, Memory, active_cache_reuse, window_cells
from reusebench.reuse.server_state import DRAFT_BEHIND_RESTORE, CacheEntry, Checkpoint, Held, Ids, Slot, kept_before

MIN_CHECKPOINT_SPACING = 64  # on a build without close checkpoints: none before this many tokens, none closer


@dataclass(frozen=True)
class Expected:
    """What a request should re-process and why."""

    prompt_n: int
    cache_n: int
    cause: str
    wrong_output: bool = False  # reused state was computed for other tokens or another LoRA
    served: Served = Served.NOT_HELD  # where the reused state came from, in the log's vocabulary
    not_modelled: str = ""  # why the count is not predicted ("" when it is)


class _Kept(NamedTuple):
    """What a prompt keeps of its slot's state."""

    n_past: int
    why: str
    stale: bool = False  # the kept state holds removed tokens or another prompt's
    as_is: bool = False  # the live state itself, not a checkpoint's: its window may have a hole
    checkpoint: bool = False  # a checkpoint restored, or none before the divergence (forced full)


def _ids(tokens: Sequence[int]) -> Ids:
    return tokens if isinstance(tokens, Segments) else tuple(tokens)


class ServerModel:
    """One llama-server's reuse state, advanced request by request, by the rules of a build's capabilities."""

    def __init__(self, memory: Memory, launch: Launch, capabilities: Capabilities) -> None:
        self.memory = memory
        self.launch = launch
        self.capabilities = capabilities
        self.rules = capabilities.rules  # each probed value, else the pinned build's: looked up once
        self.cache_reuse = active_cache_reuse(memory, launch)
        # The window the server's reuse test subtracts: none without SWA, nor with --swa-full on a build that then
        # treats the model as one without.
        dropped = launch.swa_full and self.rules.swa_full_drops_window
        self.window = 0 if dropped else memory.window
        # Checkpoints for memory that cannot be rolled back: recurrent state, or a window's cache unless it is full.
        self.checkpointing = launch.ctx_checkpoints > 0 and memory.needs_checkpoints and not (
            memory.kind == "swa" and launch.swa_full)
        # The RAM cache's limits: bytes, where the state's bytes were measured, and tokens, the server's context
        self.ram_limit_bytes = launch.cache_ram_mib * 1024 * 1024 if launch.cache_ram_mib > 0 and memory.state else 0
        self.ram_limit_tokens = launch.total_ctx if launch.n_ctx and (
            launch.cache_ram_mib < 0 or self.ram_limit_bytes) else 0
        self.restart()

    @property
    def global_lora(self) -> tuple[float, ...]:
        return (1.0,) * self.launch.lora_adapters  # --lora applies every adapter at scale 1

    def restart(self) -> None:
        """A fresh server (or one that woke from sleep): empty slots and an empty RAM cache."""
        self.slots = [Slot(i, Held(computed_with=self.global_lora), self.global_lora)
                      for i in range(self.launch.n_slots)]
        self.ram = PromptCache(self.ram_limit_bytes, self.ram_limit_tokens)
        self.task = 0
        self.woke = False
        self.last_slot = 0
        self.streams: list[swa.Cells] = []
        if self.memory.kind == "swa":  # one stream for all slots with unified KV, else one each
            cells = window_cells(self.memory, self.launch)
            count = 1 if self.launch.kv_unified else self.launch.n_slots
            self.streams = [swa.Cells(cells, self.memory.window, self.memory.chunked) for _ in range(count)]

    def sleep(self) -> None:
        """Sleeping frees the model; waking reloads it with empty slots and RAM cache."""
        self.restart()
        self.woke = True  # the next request wakes it

    # -- the window's cells ------------------------------------------------------------------------------

    def _cells(self, slot: Slot) -> swa.Cells | None:
        if not self.streams:
            return None
        return self.streams[0 if self.launch.kv_unified else slot.index]

    def _snapshot(self, slot: Slot) -> Held:
        """What a saved copy of the slot holds (RAM entry, slot file): its window's positions too."""
        cells = self._cells(slot)
        if cells is None:
            return slot.held
        return replace(slot.held, window=cells.state(slot.index, bool(self.rules.swa_state_window_only)))

    def _hold(self, slot: Slot, held: Held) -> None:
        """The slot takes `held` as its contents: a saved copy is read back, an empty one clears its memory."""
        slot.held, slot.draft_behind = replace(held, window=()), False
        cells = self._cells(slot)
        if cells is not None:
            cells.load(slot.index, held.window)

    def _pos_min(self, slot: Slot, last_pos: int) -> int:
        """The lowest position the slot's memory holds: the recurrent state's, which is its last; a window's lowest
        cell."""
        cells = self._cells(slot)
        return cells.pos_min(slot.index) if cells is not None else last_pos

    # -- slot files ----------------------------------------------------------------------------------

    def saved(self, slot: int) -> Held:
        """What a slot file written now holds: tokens and state; its checkpoints only on a build that writes them."""
        held = self._snapshot(self.slots[slot])
        return held if self.rules.slot_file_checkpoints else replace(held, checkpoints=())

    def restore(self, slot: int, held: Held) -> None:
        """The file's tokens and state. Its checkpoints where the file carries them; else, on a build whose restore
        keeps the slot's own, those, foreign where they were computed from other tokens; else none."""
        if self.rules.slot_file_checkpoints:
            checkpoints = held.checkpoints
        elif self.rules.restore_keeps_slot_checkpoints:
            before = self.slots[slot].held
            shared = common_prefix(before.tokens, held.tokens)
            checkpoints = tuple(replace(c, foreign=c.foreign or c.n_tokens > shared) for c in before.checkpoints)
        else:
            checkpoints = ()
        self._hold(self.slots[slot], replace(held, checkpoints=checkpoints))
        self.slots[slot].draft_behind = self.launch.draft_model

    def erase(self, slot: int) -> None:
        """`POST /slots/N?action=erase`: the slot holds nothing, its checkpoints gone; its LoRA stays."""
        self._hold(self.slots[slot], Held(computed_with=self.slots[slot].lora))

    # -- a completion --------------------------------------------------------------------------------

    def scales(self, lora: Sequence[Mapping[str, float]] | None) -> tuple[float, ...]:
        """A request's adapter list: every loaded adapter, scale 0 for ids it leaves out; none: the global list."""
        if not lora:
            return self.global_lora
        given = {int(a["id"]): float(a["scale"]) for a in lora}
        return tuple(given.get(i, 0.0) for i in range(self.launch.lora_adapters))

    def complete(self, tokens: Sequence[int], *, lora: Sequence[Mapping[str, float]] | None = None,
                 user_starts: Sequence[int] = (), images: Sequence[tuple[int, int]] = (),
                 cache_prompt: bool | None = None) -> Expected:
        """Predict one completion request and advance the state as the server would; `images` are the (start,
        length) of the prompt's images."""
        tokens = _ids(tokens)
        self.task += 1
        scales = self.scales(lora)
        slot, why, similar = self._select(tokens, scales)
        ram_restored = bool(why)
        cleared = bool(lora) and scales != slot.lora  # a non-empty lora that differs clears the slot
        if cleared:
            self._hold(slot, Held(computed_with=scales))
            why = ["LoRA-change clear after restoring from RAM" if why else "LoRA-change clear"]
        slot.lora = scales
        self._save_idle_slots(slot)
        use_cache = self.launch.cache_prompt if cache_prompt is None else cache_prompt
        n_past, reason, stale, kept_as_is, checkpoint = self._n_past(slot, tokens) if use_cache else _Kept(
            0, "cache_prompt off")
        if not (cleared and n_past == 0):
            why.append(reason)
        held = slot.held
        wrong = n_past > 0 and (stale or held.computed_with != scales)
        # checkpoints past the kept position go (before the one token given back below)
        kept = tuple(c for c in held.checkpoints if c.pos_max <= n_past)
        if n_past == len(tokens) and n_past > 0:  # one token is always evaluated, for its logits
            n_past -= 1
        # A kept window with a hole makes the output wrong, and the state computed over it (a checkpoint's window
        # always covers its own last position's).
        wrong = wrong or (kept_as_is and swa.lacks_window(self._cells(slot), slot.index, n_past, self.memory.window,
                                                          self.memory.chunked))
        slot.held = Held(tokens[:n_past], kept, None if wrong else scales, stale and n_past > 0)
        cells = self._cells(slot)
        if cells is not None:
            cells.seq_rm(slot.index, n_past)
        marked = user_starts if self.rules.user_message_checkpoints else ()
        self._prefill(slot, tokens, n_past, frozenset(marked), dict(images))
        slot.t_last = self.task
        where = served(checkpoint=checkpoint, ram_restored=ram_restored, similar_slot=similar,
                       ram_cache=self.launch.cache_ram_mib != 0, woke=self.woke, lora_clear=cleared)
        self.woke = False
        # b11434 restores a slot file into the target's context alone (llama.cpp #28619): a prompt that keeps the
        # restored state meets a draft context that holds other positions, and the server fails it (HTTP 500)
        unknown = DRAFT_BEHIND_RESTORE if slot.draft_behind and n_past > 0 else ""
        slot.draft_behind = False  # re-processed from the start (both contexts agree again), or failed
        return Expected(len(tokens) - n_past, n_past, "; ".join(w for w in why if w), wrong, where, unknown)

    def answered(self, generated: Sequence[int]) -> None:
        """The reply: generated tokens are fed back as they are sampled, all but the last one."""
        slot = self.slots[self.last_slot]
        fed = _ids(generated)[:-1]
        cells = self._cells(slot)
        if cells is not None:
            start = len(slot.held.tokens)
            for position in range(start, start + len(fed)):  # one decode per sampled token
                cells.decode(slot.index, [position], self.launch.n_ubatch)
        slot.held = replace(slot.held, tokens=slot.held.tokens + fed)

    # -- slot selection and the RAM cache ------------------------------------------------------------

    def _select(self, tokens: Ids, scales: tuple[float, ...]) -> tuple[Slot, list[str], bool]:
        """By similarity above the threshold, else least recently used; either may go through the RAM cache: the
        slot, the RAM cache's word when it loaded an entry, and whether similarity picked it."""
        chosen, update, why = None, False, []
        if self.launch.slot_prompt_similarity != 0:
            best = 0.0
            for index, slot in enumerate(self.slots):
                if not slot.held.tokens:
                    continue
                f_sim = common_prefix(slot.held.tokens, tokens) / len(tokens)
                if f_sim > best and f_sim > self.launch.slot_prompt_similarity:
                    best, chosen = f_sim, index
            if chosen is not None:
                update = best * len(tokens) / len(self.slots[chosen].held.tokens) < F_KEEP_SAVE
        similar = chosen is not None
        if chosen is None:
            for index, slot in enumerate(self.slots):
                if chosen is None or slot.t_last <= self.slots[chosen].t_last:
                    chosen = index
            update = True
        assert chosen is not None  # there is always a slot
        self.last_slot = chosen
        slot = self.slots[chosen]
        if update and self.launch.cache_ram_mib != 0:
            self._ram_save(slot)
            if self._ram_load(slot, tokens, scales):
                why.append("found in RAM cache")
            self.ram.update()
        return slot, why, similar

    def _ram_save(self, slot: Slot) -> bool:
        """The slot's state into the RAM cache (``PromptCache.alloc``). On a build whose entries keep their LoRA,
        only entries of the same LoRA count as the same or extended. Whether it was saved."""
        held = slot.held
        lora_aware = self.rules.ram_cache_keeps_lora

        def same(entry: CacheEntry) -> bool:
            return not lora_aware or entry.lora == slot.lora

        if not held.tokens:
            return False
        snapshot = self._snapshot(slot)
        return self.ram.alloc(CacheEntry(snapshot, slot.lora, self._entry_bytes(snapshot)), same)

    def _entry_bytes(self, held: Held) -> int:
        """A RAM entry's size as the cache counts it: the state's bytes and its checkpoints'."""
        state = self.memory.state
        if state is None:
            return 0
        return state.full(len(held.tokens), self._window_written(held), self.launch.n_streams) + sum(
            c.bytes for c in held.checkpoints)

    def _window_written(self, held: Held) -> int:
        """The window cells a state write holds: those the last position attends to (a hybrid's window has no
        cells model here: all of its last window's positions)."""
        if self.streams or not self.memory.window:
            return len(held.window)
        n, window = len(held.tokens), self.memory.window
        return n - (n - 1) // window * window if self.memory.chunked else min(n, window)

    def _ram_load(self, slot: Slot, tokens: Ids, scales: tuple[float, ...]) -> bool:
        """Take the entry that beats the slot on both kept share and covered share; it leaves the cache. On a build
        whose entries keep their LoRA, only an entry of the request's LoRA, and the slot takes that LoRA."""
        lora_aware = self.rules.ram_cache_keeps_lora
        if not slot.held.tokens and not self.rules.empty_slot_loads_from_ram:
            return False
        best = self.ram.better(slot.held.tokens, tokens, (lambda entry: entry.lora == scales) if lora_aware else None)
        if best is None:
            return False
        entry = self.ram.take(best)
        self._hold(slot, entry.held)
        if lora_aware:
            slot.lora = entry.lora
        return True

    def _save_idle_slots(self, busy: Slot) -> None:
        """After a completion task launches, every other slot is copied to RAM; with unified KV, also cleared."""
        if not self.launch.cache_idle_slots:
            return
        for slot in self.slots:
            if slot is not busy:
                if self._ram_save(slot):
                    self.ram.update()
                if self.launch.kv_unified:
                    self._hold(slot, Held(computed_with=slot.lora))

    # -- what is kept, and the checkpoints a prefill creates ---------------------------------------------

    def _n_past(self, slot: Slot, tokens: Ids) -> _Kept:
        """How much of the slot's state this prompt keeps, and why."""
        held = slot.held
        n_past = common_prefix(held.tokens, tokens)
        stale = held.stale
        last_pos = len(held.tokens) - 1  # where the recurrent state stands
        shifted = 0
        if self.cache_reuse > 0:
            shifted, last_pos = self._shift_chunks(slot, tokens, n_past, last_pos)
            n_past += shifted
        if n_past == 0:
            return _Kept(0, "no common prefix" if held.tokens else "empty slot")
        # The state is kept as it is while its lowest position lies below the threshold; b11434's test keeps one
        # position more for an identical prompt and looks at a prompt that extends everything the slot holds too.
        bounded = self.rules.checkpoint_search_bounded
        has_new = n_past < len(tokens)
        threshold = max(0, n_past - self.window - (0 if has_new or not bounded else 1))
        tested = n_past <= len(held.tokens) if bounded else n_past < len(held.tokens)
        if self.rules.extension_returns_to_checkpoint:  # b9246 to b9496: an extension is tested too, one lower
            threshold, tested = max(0, n_past - self.window - 1), n_past <= len(held.tokens)
        # An attention cache holds every position from 0: a threshold of 0 alone (one token kept) sends it back.
        pos_min = self._pos_min(slot, last_pos) if self.memory.needs_checkpoints else 0
        if not tested or pos_min < threshold:  # a shifted recurrent state still holds the removed gap
            return _Kept(n_past, f"kept {n_past} tokens in slot", stale or (shifted > 0 and self.memory.needs_checkpoints),
                         True)
        for checkpoint in reversed(held.checkpoints):
            if bounded and checkpoint.pos_max > n_past:  # past the divergence
                continue
            if checkpoint.pos_min < threshold or (bounded and checkpoint.pos_min == 0):
                pos_next = min(n_past, max(checkpoint.pos_min + 1, checkpoint.pos_max))
                cells = self._cells(slot)
                if cells is not None:
                    cells.load(slot.index, checkpoint.window)
                how = "cache-reuse shifted chunk then restored" if shifted else "restored"
                whose = " (another prompt's, kept across the restore)" if checkpoint.foreign else ""
                return _Kept(min(pos_next, len(held.tokens), checkpoint.n_tokens),
                             f"{how} checkpoint at n_tokens={checkpoint.n_tokens}{whose}",
                             stale or shifted > 0 or checkpoint.foreign, checkpoint=True)
        return _Kept(0, "forced full re-processing (no checkpoint before divergence)", checkpoint=True)

    def _shift_chunks(self, slot: Slot, tokens: Ids, n_past: int, last_pos: int) -> tuple[int, int]:
        """--cache-reuse: chunks of at least N cached tokens that reappear later move to their new place (the gap
        before each is removed). Returns (tokens gained, where the recurrent state's position ends up: it moves
        with its chunk)."""
        cached = slot.held.tokens
        cells = self._cells(slot)
        head_c = head_p = n_past
        gained = 0
        while head_c < len(cached) and head_p < len(tokens):
            match = shared_run(cached, head_c, tokens, head_p)
            if match >= self.cache_reuse:
                if head_c <= last_pos < head_c + match:
                    last_pos += head_p - head_c
                if cells is not None:
                    cells.seq_rm(slot.index, head_p, head_c)
                    cells.seq_add(slot.index, head_c, head_c + match, head_p - head_c)
                gained += match
                head_c += match
                head_p += match
            else:
                head_c += 1
        return gained, last_pos

    def _prefill(self, slot: Slot, tokens: Ids, start: int, user_starts: frozenset[int],
                 images: Mapping[int, int]) -> None:
        """Process the prompt in batches as the server does, creating checkpoints where it would; an image (by its
        start: its length) is a chunk of its own."""
        cells = self._cells(slot)
        slot.held = replace(slot.held, tokens=tokens)
        if not self.checkpointing:
            if cells is not None:  # an image's tokens decode like text's here: only the window's cells are followed
                for batch_start in range(start, len(tokens), self.launch.n_batch):
                    batch = range(batch_start, min(len(tokens), batch_start + self.launch.n_batch))
                    cells.decode(slot.index, batch, self.launch.n_ubatch)
            return
        n_batch, n_ubatch, min_step = self.launch.n_batch, self.launch.n_ubatch, self.launch.checkpoint_min_step
        end = len(tokens)
        last_user = max(user_starts, default=-1)
        ends = [end - offset for offset in end_checkpoint_offsets(n_batch, n_ubatch)]  # a batch stops before these
        users = sorted(user_starts)
        image_starts = sorted(images)
        n = start
        while n < end:
            after_image = False
            while n in images:  # images first, each whole, then the text that follows in the same step
                if cells is not None:
                    cells.decode(slot.index, range(n, n + images[n]), n_ubatch)
                n, after_image = n + images[n], True
            if n >= end:
                break
            batch_start = n
            checkpoints = slot.held.checkpoints
            # the batch runs to its size or the prompt's end, and stops early at a user message that gets a
            # checkpoint, where a checkpoint before the end goes, or where an image begins: the first of these
            stops = [min(end, batch_start + n_batch), *(e for e in ends if e > batch_start),
                     *image_starts[bisect.bisect_right(image_starts, batch_start):][:1]]
            stops += [u for u in users[bisect.bisect_right(users, batch_start):]
                      if u == last_user or not checkpoints or u > checkpoints[-1].n_tokens + min_step][:1]
            n = min(stops)
            near_end = end < n + n_ubatch
            checkpoints = slot.held.checkpoints
            wanted = (n == end or batch_start in user_starts or near_end) and batch_start > 0 and (
                not checkpoints or batch_start == last_user or near_end
                or batch_start > checkpoints[-1].n_tokens + min_step)
            wanted = wanted and (not after_image or bool(self.rules.checkpoint_after_image))
            if wanted and not self.rules.close_checkpoints:  # 2026-03: 64 tokens in, 64 apart
                wanted = n >= MIN_CHECKPOINT_SPACING and (
                    not checkpoints or batch_start > checkpoints[-1].n_tokens + MIN_CHECKPOINT_SPACING)
            if wanted:
                self._checkpoint(slot, batch_start)
            if cells is not None:
                cells.decode(slot.index, range(batch_start, n), n_ubatch)

    def _checkpoint(self, slot: Slot, n_tokens: int) -> None:
        """create_checkpoint: thin out earlier tasks' close ones when full, drop the oldest, replace a twin."""
        cells = self._cells(slot)
        state, streams = self.memory.state, self.launch.n_streams
        if cells is None:
            made = Checkpoint.recurrent(n_tokens, self.task, state.partial(0, streams) if state else 0)
        else:  # the window's lowest cell as the server records it, and what a partial state write holds
            window = cells.state(slot.index, bool(self.rules.swa_state_window_only))
            made = Checkpoint(n_tokens, self.task, pos_min=cells.pos_min(slot.index), pos_max=n_tokens - 1,
                              window=window, bytes=state.partial(len(window), streams) if state else 0)
        kept = kept_before(slot.held.checkpoints, made, limit=self.launch.ctx_checkpoints,
                           min_step=self.launch.checkpoint_min_step)
        slot.held = replace(slot.held, checkpoints=(*kept, made))
