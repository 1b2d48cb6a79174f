"""How two outputs of llama-server compare: where two runs of token ids part (``common_prefix``, ``shared_run``), and how far one
completion's output is from another's, teacher-forced (``difference``). What counts as "the same output" given
the noise of a batch shape is ``reuse.verification``'s rule; the capability probes and the session share these two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reusebench.llama.client import Completion, TokenProbs

Tokens = Sequence[int] | np.ndarray  # ids as a list, or as the perfect cache and the tap hold them


def common_prefix(a: Tokens, b: Tokens) -> int:
    """How many leading token ids `a` and `b` share."""
    return shared_run(a, 0, b, 0)


def shared_run(a: Tokens, i: int, b: Tokens, j: int) -> int:
    """How many token ids `a` from `i` and `b` from `j` share, in time that grows with that count, not with the
    lengths: a first mismatch ends it at once, a run is compared in chunks that double. (``--cache-reuse``
    looks for a chunk at every cached position, so its model calls this once per position of a long prompt.)"""
    limit = min(len(a) - i, len(b) - j)
    if limit <= 0 or a[i] != b[j]:
        return 0
    n, step = 0, 64
    while n < limit:
        k = min(step, limit - n)
        x, y = a[i + n:i + n + k], b[j + n:j + n + k]
        if not _same(x, y):
            return n + int(np.flatnonzero(np.asarray(x) != np.asarray(y))[0])
        n, step = n + k, step * 2
    return n


def _same(x: Tokens, y: Tokens) -> bool:
    """Equal ids, compared in C: as tuples (a list and a tuple of the same ids are not ==), or as arrays."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return bool(np.array_equal(x, y))
    return (x if type(x) is tuple else tuple(x)) == (y if type(y) is tuple else tuple(y))


@dataclass(frozen=True)
class Difference:
    """How far an output is from a reference, teacher-forced (positions up to the first differing token)."""

    identical: bool
    delta: float  # the largest probability difference at a compared position, over its most likely token's
    first_token: int | None  # where the tokens first differ (or one output ends), None when they never do
    compared: int  # positions compared

    def describe(self) -> str:
        """Positions, ids and figures only, never text."""
        where = "same tokens" if self.first_token is None else f"tokens differ from position {self.first_token}"
        return f"{where}; largest difference {self.delta:.2g} of the top probability over {self.compared} position(s)"


def _probabilities(position: TokenProbs) -> dict[int, float]:
    return {token: math.exp(logprob) for token, logprob in ((position.id, position.logprob), *position.top)}


def _position_delta(a: TokenProbs, b: TokenProbs) -> float:
    """The largest probability difference of a token either top-k list holds at one position, over the
    probability of the position's most likely token: a real model's sharp distribution and a random model's flat
    one on one scale. A position either side gave no alternatives for compares its token only: llama-server
    b11434 sets no probabilities for a speculative draft's accepted tokens (its logprob a placeholder 0, llama.cpp
    #27196), and a placeholder against a real probability would read as a difference reuse did not make."""
    if not a.top or not b.top:
        return 0.0
    pa, pb = _probabilities(a), _probabilities(b)
    least_a, least_b = min(pa.values()), min(pb.values())

    def gap(token: int) -> float:
        if token in pa and token in pb:
            return abs(pa[token] - pb[token])
        # listed on one side only: on the other it is at most as likely as that list's least likely token
        return max(0.0, pa[token] - least_b) if token in pa else max(0.0, pb[token] - least_a)

    return max(gap(token) for token in {*pa, *pb}) / max(*pa.values(), *pb.values())


def difference(got: Completion, reference: Completion) -> Difference:
    """`got` against `reference`, position by position up to and including the first token where they differ."""
    delta, compared, first = 0.0, 0, None
    same_numbers = True
    for position, (a, b) in enumerate(zip(got.probs, reference.probs)):
        delta = max(delta, _position_delta(a, b))
        same_numbers = same_numbers and (a.id, a.logprob, a.top) == (b.id, b.logprob, b.top)
        compared += 1
        if a.id != b.id:
            first = position
            if not a.top or not b.top:  # a flip no probability can show to be a near-tie: counted in full
                delta = 1.0
            break
    shared = common_prefix(got.tokens, reference.tokens)
    if first is None and (shared < max(len(got.tokens), len(reference.tokens))):
        first = shared  # the ids (or the lengths) part where no probabilities were given
    return Difference(first is None and same_numbers, delta, first, compared)
