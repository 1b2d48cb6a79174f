"""Token ids as runs of known blocks: ``Segments``, so that the reuse model can follow a trace of 145M tokens.

A replayed trace's prompt is made of blocks: each of its hash ids is a fixed run of token ids, the last one cut to
the request's length, and its answer a run of one forced token (``trace.prompts``). Two prompts that hold the same
block at the same place hold the same ids there, so where they part is found a block at a time; only the first
pair of blocks that differ is compared id by id, which keeps the count exact (two different blocks may still
share their first ids by chance, and so does the server). The model's operations on a prompt (length, a prefix,
an appended answer, where two part, one id) work on ``Segments`` as on a tuple of ids.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, overload

from reusebench.llama import outputs


class BlockIds(Protocol):
    """A block's ids: a hash id's run of tokens (at most the block size of them), or the answer's forced token."""

    def __call__(self, block: int) -> Sequence[int]: ...

    def first(self, block: int) -> int:
        """Its first id, without the rest."""
        ...


SHORT_RUN = 2


@dataclass(frozen=True)
class Segments(Sequence[int]):
    """A sequence of token ids as ``(block, length)`` runs: the first `length` ids of `ids(block)`."""

    runs: tuple[tuple[int, int], ...]
    ids: BlockIds

    @cached_property
    def _ends(self) -> list[int]:
        ends, total = [], 0
        for _, length in self.runs:
            total += length
            ends.append(total)
        return ends

    @cached_property
    def prefix_keys(self) -> list[int]:
        """A key per run prefix (keys[k] stands for the first k runs): equal keys, equal ids. A run of at most
        ``SHORT_RUN`` ids is keyed by its ids, since two blocks may begin with the same ids by chance."""
        keys = [0]
        for run in self.run_keys:
            keys.append(hash((keys[-1], run)))
        return keys

    @cached_property
    def run_keys(self) -> list[tuple[int, ...]]:
        return [self.run_key(k) for k in range(len(self.runs))]

    @cached_property
    def firsts(self) -> list[int]:
        """Each run's first id."""
        first = self.ids.first
        return [first(block) for block, _ in self.runs]

    def run_key(self, k: int) -> tuple[int, ...]:
        block, length = self.runs[k]
        return tuple(self.ids(block)[:length]) if length <= SHORT_RUN else (block, length)

    def __len__(self) -> int:
        return self._ends[-1] if self.runs else 0

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Segments: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if start != 0 or step != 1:
                raise ValueError("Segments keep prefixes only")
            return self.prefix(stop)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        run, offset = self._locate(index)
        return self.ids(self.runs[run][0])[offset]

    def prefix(self, n: int) -> Segments:
        """The first `n` ids."""
        if n >= len(self):
            return self
        run = bisect.bisect_right(self._ends, n)
        start = self._ends[run - 1] if run else 0
        tail = ((self.runs[run][0], n - start),) if n > start else ()
        return Segments(self.runs[:run] + tail, self.ids)

    def __add__(self, other: object) -> Segments:
        if isinstance(other, Segments) and other.ids is self.ids:
            return Segments(self.runs + other.runs, self.ids)
        if isinstance(other, tuple) and not other:
            return self
        return NotImplemented

    def __radd__(self, other: object) -> Segments:
        if isinstance(other, tuple) and not other:  # an empty slot's () and a prompt
            return self
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Segments):
            return len(self) == len(other) and shared_run(self, 0, other, 0) == len(self)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.runs)

    def _locate(self, position: int) -> tuple[int, int]:
        """(run, offset in it) of `position`."""
        run = bisect.bisect_right(self._ends, position)
        return run, position - (self._ends[run - 1] if run else 0)

    def _run_ids(self, run: int, offset: int) -> Sequence[int]:
        block, length = self.runs[run]
        return self.ids(block)[offset:length]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share; runs of blocks compare a block at a time."""
    return shared_run(a, 0, b, 0)


def shared_run(a: Sequence[int], i: int, b: Sequence[int], j: int) -> int:
    """How many ids `a` from `i` and `b` from `j` share (``llama.outputs.shared_run``), whole equal blocks at once."""
    if not (isinstance(a, Segments) and isinstance(b, Segments)):
        if isinstance(a, Segments) or isinstance(b, Segments):  # an empty slot beside a prompt
            if not len(a) or not len(b):
                return 0
            return outputs.shared_run(list(a), i, list(b), j)
        return outputs.shared_run(a, i, b, j)
    if i >= len(a) or j >= len(b):
        return 0
    (ra, oa), (rb, ob) = a._locate(i), b._locate(j)
    n = 0
    while ra < len(a.runs) and rb < len(b.runs):
        if oa == 0 and ob == 0 and a.runs[ra] == b.runs[rb]:  # the same block, as long: the same ids
            n += a.runs[ra][1]
            ra, rb = ra + 1, rb + 1
            continue
        if oa == 0 and ob == 0 and a.ids.first(a.runs[ra][0]) != b.ids.first(b.runs[rb][0]):
            return n  # two blocks that part at once: most do, and their other ids need not be drawn
        x, y = a._run_ids(ra, oa), b._run_ids(rb, ob)
        k = min(len(x), len(y))
        same = outputs.common_prefix(tuple(x[:k]), tuple(y[:k]))
        n += same
        if same < k:
            return n
        oa, ob = oa + k, ob + k
        if oa == a.runs[ra][1]:
            ra, oa = ra + 1, 0
        if ob == b.runs[rb][1]:
            rb, ob = rb + 1, 0
    return n


def user_starts(tokens: Sequence[int], delimiter: Sequence[int]) -> tuple[int, ...]:
    """Every position where the delimiter's tokens begin, as the server splits a prompt into message spans."""
    width = len(delimiter)
    if not width:
        return ()
    return tuple(i for i in range(len(tokens) - width + 1) if list(tokens[i:i + width]) == list(delimiter))
