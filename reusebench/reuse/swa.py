"""The sliding-window half of an iSWA KV cache, cell by cell, as llama.cpp fills it.

A model with sliding-window attention (Gemma 3: a 512-token window on five of every six layers) keeps two KV
caches: a full one for the global layers, which can be cut anywhere, and a small ring of cells for the window
layers. Which positions that ring still holds decides what llama-server can reuse without a checkpoint (its
lowest position, ``pos_min``, against the threshold ``pos_next - n_swa``). The ring is not a plain FIFO: a cell
is taken over only when a new token needs room and the cell's position has left its sequence's window, the scan
starts from a moving head, and overwriting a cell purges every lower position of its sequence. So the model
replays the allocator itself; docs/llama-server-reuse.md, "Sliding-window attention", gives each rule with its
source line in b11434.

One ``Cells`` is one stream: one per slot without a unified KV cache, one shared by every slot with it. A
sequence is a slot's index.
"""

from __future__ import annotations

from collections.abc import Sequence

CELL_PADDING = 256  # the window's cache is padded to 256 cells, and so is the context


def pad(n: int, to: int = CELL_PADDING) -> int:
    return -(-n // to) * to


def window_cells(n_ctx: int, window: int, n_ubatch: int, n_slots: int, unified: bool, swa_full: bool) -> int:
    """How many cells the window's cache has per stream: the window of every sequence the stream holds plus one
    ubatch, padded, at most the context of a slot; with --swa-full the whole context of a slot."""
    n_ctx = pad(n_ctx)
    per_slot = n_ctx if unified else pad(n_ctx // n_slots)
    if swa_full:
        return per_slot
    return pad(min(per_slot, window * (n_slots if unified else 1) + n_ubatch))


class Cells:
    """One stream of the window's cache: each cell holds one (position, sequence) or nothing."""

    def __init__(self, size: int, window: int, chunked: bool = False) -> None:
        self.size, self.window, self.chunked = size, window, chunked
        self.pos = [-1] * size  # -1: empty
        self.seq = [-1] * size
        self.head = 0
        self.used = 0  # cells that hold a position: counted as they change, a scan per ubatch is quadratic

    def pos_min(self, seq: int) -> int:
        """The lowest position `seq` holds, -1 when it holds none."""
        held = [p for p, s in zip(self.pos, self.seq) if s == seq]
        return min(held) if held else -1

    def pos_max(self, seq: int) -> int:
        held = [p for p, s in zip(self.pos, self.seq) if s == seq]
        return max(held) if held else -1

    def masked(self, pos: int, pos_next: int) -> bool:
        """Whether a cell at `pos` is outside the window of a token at `pos_next` (``is_masked_swa``): the last
        `window` positions (standard), or the `window`-token chunk `pos_next` lies in (chunked, llama4)."""
        if self.chunked:
            return pos < pos_next // self.window * self.window
        return pos_next - pos >= self.window

    def seq_rm(self, seq: int, p0: int = 0, p1: int | None = None) -> None:
        """Drop `seq`'s positions in [p0, p1); the head moves back to the first freed cell."""
        first = self.size
        for i in range(self.size):
            if self.seq[i] == seq and self.pos[i] >= p0 and (p1 is None or self.pos[i] < p1):
                self.pos[i], self.seq[i] = -1, -1
                self.used -= 1
                first = min(first, i)
        if first < self.head:
            self.head = first

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift `seq`'s positions in [p0, p1) by `delta` (--cache-reuse moving a chunk)."""
        for i in range(self.size):
            if self.seq[i] == seq and p0 <= self.pos[i] < p1:
                self.pos[i] += delta

    def decode(self, seq: int, positions: Sequence[int], n_ubatch: int) -> None:
        """One llama_decode of `positions` for `seq`, in ubatches, each placed before the next is looked for."""
        for start in range(0, len(positions), n_ubatch):
            ubatch = positions[start:start + n_ubatch]
            self._apply(self._find(len(ubatch)), seq, ubatch)

    def state(self, seq: int, window_only: bool) -> tuple[int, ...]:
        """The positions a saved state of `seq` holds, in cell order: those inside the window of its last one
        where the build drops the rest (``state_write``), else all."""
        last = self.pos_max(seq)
        return tuple(p for p, s in zip(self.pos, self.seq)
                     if s == seq and not (window_only and self.masked(p, last)))

    def load(self, seq: int, positions: Sequence[int]) -> None:
        """A saved state read back into `seq` (``state_read_meta``): its old cells go, the saved ones are placed
        as one ubatch."""
        self.seq_rm(seq)
        if positions:
            self._apply(self._find(len(positions)), seq, positions)

    # -- the allocator ---------------------------------------------------------------------------------------

    def _find(self, n_tokens: int) -> list[int]:
        """``find_slot`` for a ubatch, not contiguous: from the head, wrapping, every empty cell or one whose
        position has left its own sequence's window."""
        head = 0 if self.head > self.used + 2 * n_tokens else self.head
        pos_max: dict[int, int] = {}
        found: list[int] = []
        tested = 0
        while len(found) < n_tokens:
            if tested >= self.size:
                raise ValueError(f"no room for {n_tokens} tokens in {self.size} window cells")
            if head >= self.size:
                tested += self.size - head
                head = 0
                continue
            i = head
            head += 1
            tested += 1
            if self.pos[i] < 0:
                found.append(i)
                continue
            owner = self.seq[i]
            if owner not in pos_max:
                pos_max[owner] = self.pos_max(owner)
            if self.masked(self.pos[i], pos_max[owner] + 1):
                found.append(i)
        return found

    def _apply(self, cells: list[int], seq: int, positions: Sequence[int]) -> None:
        """``apply_ubatch``: overwrite the cells, then purge every position of an overwritten sequence up to the
        highest one overwritten, so each sequence keeps a contiguous range."""
        overwritten: dict[int, int] = {}
        for i, pos in zip(cells, positions):
            if self.pos[i] >= 0:
                owner = self.seq[i]
                overwritten[owner] = max(overwritten.get(owner, -1), self.pos[i])
            else:
                self.used += 1
            self.pos[i], self.seq[i] = pos, seq
        for owner, highest in overwritten.items():
            lowest = self.pos_min(owner)
            if 0 <= lowest <= highest:
                self.seq_rm(owner, lowest, highest + 1)
        self.head = cells[-1] + 1


def lacks_window(cells: Cells | None, seq: int, n_past: int, window: int, chunked: bool) -> bool:
    """Whether the window the first new token attends to (positions after ``n_past - window``) starts below what
    sequence `seq`'s window cache holds. The server's own test rules that out unless --swa-full dropped it, and a
    saved copy kept only the window of its last position: then a resend or a re-ask reads a window with a hole at
    its start (b11434, tiny-gemma3 with --swa-full, after a RAM or slot-file round trip)."""
    if cells is None or n_past == 0:
        return False
    held_from = cells.pos_min(seq)
    needed_from = n_past // window * window if chunked else max(0, n_past - window + 1)
    return held_from < 0 or held_from > needed_from
