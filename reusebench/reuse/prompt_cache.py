"""The RAM prompt cache as the reuse model keeps it: its entries oldest first, its limits, and the questions the
server asks of them (``tools/server/server-task.cpp``, ``server_prompt_cache::alloc``, ``update`` and ``load``):

- does an entry already hold this prompt (then it is not saved again)?
- does the new entry alone exceed the size limit (then it is not saved, and is lost)?
- which entries does this prompt extend (they go when it is saved), and which oldest ones make room for it?
- which oldest entries go after a save (``update``: over the size, then over the token limit)?
- which entry beats the slot on both the share of it kept and the share of the prompt covered (``better``)?

The server compares every entry, and so does this model for prompts held as tuples. A replayed trace's prompts
(``segments.Segments``) may meet thousands of entries over 12,000 requests, so their entries are indexed by their
runs of blocks, and only those that can pass a test are compared, by the same rule. An entry that shares its first
k runs with a prompt and differs in run k can still share a few ids of run k by chance; the index finds those by
the first id of run k.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from reusebench.llama.facts import F_KEEP_LOAD
from reusebench.reuse.segments import Segments, common_prefix
from reusebench.reuse.server_state import CacheEntry, Ids


def _earliest_shortest(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Of (length, number) pairs sorted by length, those whose number is below every shorter (or as short) one's."""
    if len(pairs) < 2:
        return pairs
    numbers = np.fromiter((n for _, n in pairs), dtype=np.int64, count=len(pairs))
    earliest = np.minimum.accumulate(numbers)
    new = np.empty(len(pairs), dtype=bool)
    new[0] = True
    new[1:] = numbers[1:] < earliest[:-1]
    return [pairs[i] for i in np.flatnonzero(new)]


MANY = 32  # candidates from which ``better`` scans in numpy


class PromptCache:
    """Entries in the order the server keeps them: saved at the back, taken or evicted anywhere. `limit_bytes`
    (``--cache-ram`` MiB; 0: none, or the state's bytes unknown) and `limit_tokens` (the server's context; 0: not
    held) are the server's limits."""

    def __init__(self, limit_bytes: int = 0, limit_tokens: int = 0) -> None:
        self.limit_bytes, self.limit_tokens = limit_bytes, limit_tokens
        self._entries: dict[int, CacheEntry] = {}  # by a number that grows: dict order is the cache's order
        self._next = 0
        self._bytes = self._tokens = 0  # the totals the cache's limits are held against
        self._by_prefix: dict[int, list[tuple[int, int]]] = defaultdict(list)  # (length, number), shortest first
        self._by_head: dict[int, set[int]] = defaultdict(set)  # all runs but the last -> numbers
        # (run prefix, the next run's first id) -> that run -> numbers
        self._by_first: dict[tuple[int, int], dict[tuple[int, ...], set[int]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def n_tokens(self) -> int:
        return self._tokens

    def _evict_oldest(self) -> None:
        self.take(next(iter(self._entries)))

    def alloc(self, entry: CacheEntry, same: Callable[[CacheEntry], bool]) -> bool:
        """Save `entry` unless an entry holds its tokens or it alone exceeds the size limit; the entries it extends
        go, then the oldest until it fits. Whether it was saved."""
        tokens = entry.held.tokens
        if self.holds(tokens, same):
            return False
        limit = self.limit_bytes
        if limit and entry.bytes > limit:  # "exceeds cache size limit, skipping": the state is lost
            return False
        self.drop_extended(tokens, same)
        while limit and self._entries and self._bytes + entry.bytes > limit:  # "making room for prompt cache entry"
            self._evict_oldest()
        self.add(entry)
        return True

    def update(self) -> None:
        """The oldest entries go while the cache is over its size, then while it holds more tokens than its token
        limit, or than the size limit holds at its bytes per token where that is more (in single precision, as
        the server computes it)."""
        limit = self.limit_bytes
        while limit and self._entries and self._bytes > limit:
            self._evict_oldest()
        if not self.limit_tokens:
            return
        tokens = self.limit_tokens
        if limit:
            per_token = max(np.float32(1.0), np.float32(self._bytes) / np.float32(max(1, self._tokens)))
            tokens = max(tokens, int(np.float32(limit) / per_token))
        while self._entries and self._tokens > tokens:
            self._evict_oldest()

    def __iter__(self) -> Iterator[CacheEntry]:
        return iter(self._entries.values())

    def add(self, entry: CacheEntry) -> None:
        number, self._next = self._next, self._next + 1
        self._entries[number] = entry
        tokens = entry.held.tokens
        self._bytes += entry.bytes
        self._tokens += len(tokens)
        if isinstance(tokens, Segments) and tokens.runs:
            keys, runs, firsts, length = tokens.prefix_keys, tokens.run_keys, tokens.firsts, len(tokens)
            for k, run in enumerate(runs):
                bisect.insort(self._by_prefix[keys[k + 1]], (length, number))
                self._by_first.setdefault((keys[k], firsts[k]), {}).setdefault(run, set()).add(number)
            self._by_head[keys[-2]].add(number)

    def take(self, number: int) -> CacheEntry:
        """The entry leaves the cache."""
        entry = self._entries.pop(number)
        tokens = entry.held.tokens
        self._bytes -= entry.bytes
        self._tokens -= len(tokens)
        if isinstance(tokens, Segments) and tokens.runs:
            keys, runs, firsts, length = tokens.prefix_keys, tokens.run_keys, tokens.firsts, len(tokens)
            for k, run in enumerate(runs):
                within = self._by_prefix[keys[k + 1]]
                del within[bisect.bisect_left(within, (length, number))]
                self._by_first[(keys[k], firsts[k])][run].discard(number)
            self._by_head[keys[-2]].discard(number)
        return entry

    # -- saving ---------------------------------------------------------------------------------------

    def holds(self, tokens: Ids, same: Callable[[CacheEntry], bool]) -> bool:
        """Whether an entry holds `tokens` as its prefix (``alloc``: "prompt is already in the cache")."""
        return any(common_prefix(self._entries[n].held.tokens, tokens) == len(tokens) and same(self._entries[n])
                   for n in self._holding(tokens))

    def drop_extended(self, tokens: Ids, same: Callable[[CacheEntry], bool]) -> None:
        """Entries that `tokens` extends go (``alloc``: "removing obsolete cached prompt")."""
        for n in sorted(self._extended(tokens)):
            entry = self._entries[n]
            if common_prefix(entry.held.tokens, tokens) == len(entry.held.tokens) and same(entry):
                self.take(n)

    def _holding(self, tokens: Ids) -> Iterable[int]:
        if not isinstance(tokens, Segments) or len(tokens.runs) < 2:
            return list(self._entries)
        return [n for _, n in self._by_prefix.get(tokens.prefix_keys[-2], [])]  # its runs but the last

    def _extended(self, tokens: Ids) -> Iterable[int]:
        if not isinstance(tokens, Segments):
            return list(self._entries)
        keys = tokens.prefix_keys
        return {n for key in keys for n in self._by_head.get(key, ())}  # all its runs but the last are ours

    # -- loading ---------------------------------------------------------------------------------------

    def better(self, held: Ids, tokens: Ids, usable: Callable[[CacheEntry], bool] | None = None) -> int | None:
        """The entry ``load`` takes for a slot holding `held` and a prompt `tokens`: in cache order, one that keeps
        at least a quarter of itself and beats the best so far on both the share of it kept and the share of the
        prompt covered (an empty slot: any such entry); `usable` says which entries may be taken (a LoRA-aware
        build's). None: the slot keeps its own."""
        lcp = common_prefix(held, tokens)
        f_keep = lcp / len(held) if len(held) else -1.0
        f_sim = lcp / len(tokens)
        found = sorted(self._covering_more(tokens, lcp).items())
        if usable is not None:
            found = [(n, c) for n, c in found if usable(self._entries[n])]
        if len(found) > MANY:
            return self._better_of_many(found, len(tokens), f_keep, f_sim)
        best = None
        for n, (shared, length) in found:
            keep, sim = shared / length, shared / len(tokens)
            if keep >= F_KEEP_LOAD and f_keep < keep and f_sim < sim:
                f_keep, f_sim, best = keep, sim, n
        return best

    @staticmethod
    def _better_of_many(found: list[tuple[int, tuple[int, int]]], n_tokens: int, f_keep: float,
                        f_sim: float) -> int | None:
        """``better``'s scan in numpy: each entry taken must beat the last, so the chain is short and each step one
        pass over the rest."""
        numbers = [n for n, _ in found]
        shared = np.array([c[0] for _, c in found], dtype=np.float64)
        keep = shared / np.array([c[1] for _, c in found], dtype=np.float64)
        sim = shared / n_tokens
        fit = keep >= F_KEEP_LOAD
        best, start = None, 0
        while start < len(numbers):
            beats = fit[start:] & (keep[start:] > f_keep) & (sim[start:] > f_sim)
            if not beats.any():
                break
            at = start + int(np.argmax(beats))
            f_keep, f_sim, best, start = float(keep[at]), float(sim[at]), numbers[at], at + 1
        return best

    def _covering_more(self, tokens: Ids, lcp: int) -> dict[int, tuple[int, int]]:
        """Every entry that may share more than `lcp` ids with `tokens` and keep a quarter of itself: (ids shared,
        its length). An entry whose first k runs are the prompt's and whose run k is another shares exactly those k
        runs, unless run k begins with the same id by chance: those are compared."""
        if not isinstance(tokens, Segments):
            return {n: (common_prefix(e.held.tokens, tokens), len(e.held.tokens)) for n, e in self._entries.items()}
        keys = tokens.prefix_keys
        starts = [0]
        for _, length in tokens.runs:
            starts.append(starts[-1] + length)
        found: dict[int, tuple[int, int]] = {}
        for k in range(len(tokens.runs)):
            if starts[k + 1] <= lcp:
                continue
            run = tokens.run_keys[k]
            for other, numbers in self._by_first.get((keys[k], tokens.firsts[k]), {}).items():
                if other != run:
                    for n in numbers:
                        entry = self._entries[n].held.tokens
                        found[n] = (common_prefix(entry, tokens), len(entry))
            # sharing k + 1 runs and at most 4x as long (one that shares more is found again, at its own depth);
            # of those, only one shorter than every earlier one: an earlier entry as short that shares as much
            # beats it on both shares, so ``load`` never takes it
            within = self._by_prefix.get(keys[k + 1])
            if within:
                pairs = within[:bisect.bisect_right(within, (4 * starts[k + 1], self._next))]
                found.update((n, (starts[k + 1], length)) for length, n in _earliest_shortest(pairs))
        return found
