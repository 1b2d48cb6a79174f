"""What a perfect cache would re-process of a prompt (its ``ideal``): the tokens after the longest prefix the server
computed before (any earlier prompt with its answer), and at least one, since the server always evaluates one.

One definition for every driver: the scenario session (one per LoRA setting, ``run.steps``), a workload's run
(``reusebench.run.service``) and the tap in front of real clients (``reusebench.tap``), so that their ideals agree.

Token ids stay in memory. The store is bounded by tokens and drops its oldest sequences first; a sequence that is
a prefix of a newer one adds nothing and is dropped when the newer one comes (a conversation that only grows
keeps one entry).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from reusebench.llama.outputs import Tokens, common_prefix

DEFAULT_MAX_TOKENS = 4_000_000  # 16 MB of int32 ids: a few hundred long conversations


class PerfectCache:
    """Every sequence the server computed, for ``ideal``; thread-safe (a free-running workload's users are threads)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._held: list[np.ndarray] = []  # oldest first
        self._tokens = 0
        self.dropped = 0  # sequences dropped for the bound
        self._lock = threading.Lock()

    def longest_prefix(self, prompt: Tokens) -> int:
        ids = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            held = self._held
        return max((common_prefix(ids, seq) for seq in held), default=0)

    def ideal(self, prompt: Sequence[int]) -> int:
        return max(1, len(prompt) - self.longest_prefix(prompt))

    def add(self, sequence: Tokens) -> None:
        """The server computed `sequence` (a prompt and its answer)."""
        ids = np.asarray(sequence, dtype=np.int32)
        with self._lock:
            if any(common_prefix(ids, seq) == len(ids) for seq in self._held):
                return  # already a prefix of what is held
            kept = [seq for seq in self._held if common_prefix(ids, seq) < len(seq)]
            kept.append(ids)
            total = sum(len(seq) for seq in kept)
            while total > self.max_tokens and len(kept) > 1:
                total -= len(kept.pop(0))
                self.dropped += 1
            self._held, self._tokens = kept, total

    def clear(self) -> None:
        """Drop every sequence held."""
        with self._lock:
            self._held, self._tokens = [], 0

    @property
    def tokens(self) -> int:
        return self._tokens
