"""The tap's requests as a trace in Mooncake's format (``trace.mooncake``), so a user's own traffic replays and goes
through ``whatif`` like the shipped trace.

Each line is one request that was answered: its arrival (ms since the tap started), its prompt's and answer's
lengths, and one id per 512-token prefix block. A block's id stands for the whole prefix up to its end: a keyed
hash (BLAKE2b) of the previous block's hash and this block's token ids, numbered in order of first sight, as
Mooncake's remapped ids are. The key is drawn when the tap starts and never written, and only the numbers reach
the file, so no one can test a guessed text against it. Text is never read here; only ids, which stay in memory.

The numbering holds at most ``max_blocks`` hashes, oldest dropped first (a prefix seen again after that gets a new
id: its sharing is lost, and the drops are counted).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from reusebench.trace.mooncake import BLOCK_TOKENS, TraceRequest

MAX_BLOCKS = 1_000_000  # block hashes numbered at most (32 bytes each and an int)


class TraceWriter:
    """Appends one trace line per answered request; thread-safe (the relay's handlers call it)."""

    def __init__(self, path: Path, started_at: float, *, block_tokens: int = BLOCK_TOKENS,
                 max_blocks: int = MAX_BLOCKS) -> None:
        self.path, self.started_at, self.block_tokens, self.max_blocks = path, started_at, block_tokens, max_blocks
        self._key = secrets.token_bytes(32)
        self._numbers: OrderedDict[bytes, int] = OrderedDict()
        self._next = 0
        self.dropped = 0
        self.written = 0
        self._lock = threading.Lock()
        self._file = open(path, "x", encoding="utf-8")  # never over another trace  # noqa: SIM115

    def _number(self, digest: bytes) -> int:
        found = self._numbers.get(digest)
        if found is not None:
            self._numbers.move_to_end(digest)
            return found
        number, self._next = self._next, self._next + 1
        self._numbers[digest] = number
        if len(self._numbers) > self.max_blocks:
            self._numbers.popitem(last=False)
            self.dropped += 1
        return number

    def write(self, arrived_at: float, ids: Sequence[int] | np.ndarray, output_length: int) -> None:
        """One request that arrived at `arrived_at` (epoch seconds) with prompt `ids`."""
        data = np.asarray(ids, dtype=np.int32)
        with self._lock:
            if self._file.closed:
                return
            blocks, previous = [], b""
            for start in range(0, len(data), self.block_tokens):
                previous = hashlib.blake2b(previous + data[start:start + self.block_tokens].tobytes(),
                                           key=self._key, digest_size=32).digest()
                blocks.append(self._number(previous))
            line = TraceRequest(0, max(0, round((arrived_at - self.started_at) * 1000)), len(data), output_length,
                                tuple(blocks))
            self._file.write(line.to_json() + "\n")
            self._file.flush()
            self.written += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()
            self._numbers.clear()
