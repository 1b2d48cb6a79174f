"""A trace's requests as prompts of the model's own token ids, with exactly the trace's prefix sharing.

Each hash id becomes a fixed block of token ids, drawn from the model's vocabulary (its normal tokens, from the
GGUF file's ``tokenizer.ggml.token_type``) by a generator seeded with the id: the same id gives the same block in
every request, in a replay and in a prediction. A request's prompt is its blocks in order, the last cut to its
length. Its answer is forced: one token outside the blocks' pool, sampled every time (``logit_bias``), so what a
slot holds after a reply is known before it is sent and never continues a block by chance.

The prompts need no server: ``whatif`` builds the same ones as ``replay`` sends.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reusebench.llama import gguf_check
from reusebench.reuse.segments import Segments
from reusebench.trace.mooncake import Trace, TraceRequest, prefix_hits

NORMAL_TOKEN = 1  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL
POOL_SIZE = 4096  # ids a block draws from: two different blocks share their first id once in 4,096
SEED = 20250225  # Mooncake's FAST'25 paper: a fixed seed, so a block is the same in every run
MASK_64 = (1 << 64) - 1
ANSWER = -1  # the block id of a forced answer's run


class VocabularyError(ValueError):
    """A model whose vocabulary cannot give blocks (the message names the file)."""


@dataclass(frozen=True)
class Vocabulary:
    pool: tuple[int, ...]  # the ids blocks are drawn from
    answer: int  # the one id every answer is made of: a normal token outside the pool


@functools.lru_cache(maxsize=8)
def vocabulary(model: Path) -> Vocabulary:
    """The model's normal tokens: a seeded choice of them for blocks, and the first other one for answers."""
    types = gguf_check.number_array(model, "tokenizer.ggml.token_type")
    normal = np.flatnonzero(types == NORMAL_TOKEN)
    if len(normal) < 16:
        raise VocabularyError(f"{model}: {len(normal)} normal tokens in tokenizer.ggml.token_type; a trace's blocks "
                              "need at least 16")
    size = min(POOL_SIZE, len(normal) - 1)
    pool = np.sort(np.random.default_rng(SEED).choice(normal, size=size, replace=False))
    answer = int(np.setdiff1d(normal, pool)[0])
    return Vocabulary(tuple(int(t) for t in pool), answer)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit value of each input, the same in every run."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class BlockIds:
    """A block's ids by its hash id, `block_tokens` of them; ``ANSWER``'s are the answer token. Id k of block h is
    the pool's entry at mix(h, k): any id of any block is found without drawing the others."""

    def __init__(self, vocabulary: Vocabulary, block_tokens: int) -> None:
        self.vocabulary, self.block_tokens = vocabulary, block_tokens
        self._pool = np.asarray(vocabulary.pool, dtype=np.int64)
        self._offsets = np.arange(block_tokens, dtype=np.uint64)
        self._answer = (vocabulary.answer,) * block_tokens
        self.ids = functools.lru_cache(maxsize=4096)(self._draw)  # a prediction looks at the blocks where prompts part
        self._firsts: dict[int, int] = {}

    def __call__(self, block: int) -> tuple[int, ...]:
        return self._answer if block == ANSWER else self.ids(block)

    def first(self, block: int) -> int:
        """A block's first id (what two blocks that part at once differ in): mix(h, 0) in Python's integers."""
        if block == ANSWER:
            return self.vocabulary.answer
        found = self._firsts.get(block)
        if found is None:
            found = self._firsts[block] = self._first(block)
        return found

    def _first(self, block: int) -> int:
        x = (SEED * 0x9E3779B97F4A7C15 + block * 0xD1B54A32D192ED03) & MASK_64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK_64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK_64
        return self.vocabulary.pool[(x ^ (x >> 31)) % len(self._pool)]

    def _index(self, block: int, offsets: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # 64-bit arithmetic wraps, as the mix means it to
            seeds = np.uint64(SEED) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(block) * np.uint64(0xD1B54A32D192ED03)
            return (_mix(seeds + offsets) % np.uint64(len(self._pool))).astype(np.int64)

    def _draw(self, block: int) -> tuple[int, ...]:
        return tuple(self._pool[self._index(block, self._offsets)].tolist())

    def prompt(self, request: TraceRequest) -> Segments:
        """The request's prompt: its blocks, the last cut to its length."""
        last = request.input_length - (len(request.hash_ids) - 1) * self.block_tokens
        runs = tuple((h, self.block_tokens) for h in request.hash_ids[:-1]) + ((request.hash_ids[-1], last),)
        return Segments(runs, self)

    def answer(self, n: int) -> Segments:
        """`n` answer tokens."""
        full, rest = divmod(n, self.block_tokens)
        return Segments(((ANSWER, self.block_tokens),) * full + (((ANSWER, rest),) if rest else ()), self)

    def tokens(self, segments: Segments) -> list[int]:
        """The ids to send."""
        return [t for block, length in segments.runs for t in self(block)[:length]]


@dataclass(frozen=True)
class TracePrompt:
    """One request of a trace as it is replayed or predicted."""

    index: int  # its place in the (selected) trace, from 0
    request: TraceRequest
    prompt: Segments
    ideal: int  # what an unbounded prefix cache re-processes of it: the trace's own reuse

    @property
    def n_predict(self) -> int:
        return self.request.output_length


def trace_prompts(trace: Trace, blocks: BlockIds) -> list[TracePrompt]:
    """Every request of `trace` (already scaled to `blocks`' size) as a prompt with its ideal."""
    if blocks.block_tokens != trace.block_tokens:
        raise ValueError(f"blocks of {blocks.block_tokens} tokens for a trace of {trace.block_tokens}")
    return [TracePrompt(i, r, blocks.prompt(r), max(1, r.input_length - hit))
            for i, (r, hit) in enumerate(zip(trace.requests, prefix_hits(trace), strict=True))]
