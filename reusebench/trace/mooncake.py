"""A trace of requests in Mooncake's format: read, checked, selected, scaled, and its own statistics.

One JSON object per line (Mooncake's FAST'25 release, ``FAST25-release/traces``): ``timestamp`` (arrival, ms from
the start), ``input_length`` and ``output_length`` (tokens), ``hash_ids`` (ids of the prompt's 512-token prefix
blocks, the last one partial: two requests whose first k ids are equal share their first k blocks). No text, no
tokens. A file may be gzipped. The tap writes the same format (``tap.trace``).

Requests are taken in arrival order (a stable sort: the tap writes each when it ends). A line that is not such an
object fails the whole read, naming the file, line and field: a trace with a hole would
replay other sharing than the file's.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from reusebench.config.corpus import CORPORA_DIR

TRACES_DIR = CORPORA_DIR / "traces"  # the shipped traces, by name: NAME.jsonl.gz
BLOCK_TOKENS = 512  # the tokens behind one hash id in Mooncake's traces
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace that cannot be read; the message starts with "<file>: line N: <field>:"."""


@dataclass(frozen=True)
class TraceRequest:
    line: int  # its line in the file, from 1
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps({"timestamp": self.timestamp_ms, "input_length": self.input_length,
                           "output_length": self.output_length, "hash_ids": list(self.hash_ids)})


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order, each of ``block_tokens``-token blocks; ``scale`` 1 is the file's own sizes."""

    name: str
    requests: tuple[TraceRequest, ...]
    block_tokens: int = BLOCK_TOKENS
    scale: int = 1

    def select(self, start: int = 0, stop: int | None = None, limit: int | None = None) -> Trace:
        """Requests ``start`` to ``stop`` (0-based, stop excluded), then the first `limit` of them."""
        chosen = self.requests[start:stop]
        return replace(self, requests=chosen[:limit] if limit is not None else chosen)

    def scaled(self, scale: int) -> Trace:
        """Lengths and the block divided by `scale` (a divisor of the block), rounded up, so that every request
        keeps its number of blocks; an answer keeps at least one token."""
        if scale < 1 or self.block_tokens % scale:
            raise ValueError(f"--scale {scale}: the block of {self.block_tokens} tokens must divide by it "
                             f"(1, 2, 4, ..., {self.block_tokens})")
        return replace(self, block_tokens=self.block_tokens // scale, scale=self.scale * scale, requests=tuple(
            replace(r, input_length=math.ceil(r.input_length / scale),
                    output_length=max(1, math.ceil(r.output_length / scale))) for r in self.requests))

    @property
    def longest(self) -> int:
        """The longest request, prompt and answer."""
        return max((r.input_length + r.output_length for r in self.requests), default=0)


@dataclass(frozen=True)
class TraceStats:
    requests: int
    mean_input: float
    mean_output: float
    input_tokens: int
    cached_tokens: int  # an unbounded prefix cache's: see ``prefix_hits``

    @property
    def cache_ratio(self) -> float:
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0


STATS_DEFINITION = ("cache ratio: the share of input tokens in prefix blocks an earlier request of the file already "
                    "had (an unbounded prefix cache, requests in file order, a block counted up to the request's "
                    "length)")


def prefix_hits(trace: Trace) -> Iterator[int]:
    """Per request, how many of its tokens an unbounded prefix cache holds: its leading blocks that an earlier
    request had at the same place, behind the same blocks (a trie of the ids seen), up to its length."""
    children: dict[tuple[int, int], int] = {}  # (node, hash id) -> node; node 0 is the empty prefix
    for r in trace.requests:
        node, matched, known = 0, 0, True
        for block in r.hash_ids:
            child = children.get((node, block))
            if child is None:
                known = False
                child = children[(node, block)] = len(children) + 1
            elif known:
                matched += 1
            node = child
        yield min(matched * trace.block_tokens, r.input_length)


def stats(trace: Trace) -> TraceStats:
    inputs = sum(r.input_length for r in trace.requests)
    n = len(trace.requests)
    return TraceStats(n, inputs / n if n else 0.0, sum(r.output_length for r in trace.requests) / n if n else 0.0,
                      inputs, sum(prefix_hits(trace)))


def trace_names() -> list[str]:
    return sorted(p.name.split(".")[0] for p in TRACES_DIR.glob("*.jsonl*"))


def trace_path(name_or_path: str) -> Path:
    """A trace file by path, or a shipped trace by name (``mooncake-conversation``)."""
    given = Path(name_or_path)
    if given.is_file():
        return given
    for suffix in (".jsonl.gz", ".jsonl"):
        shipped = TRACES_DIR / f"{name_or_path}{suffix}"
        if shipped.is_file():
            return shipped
    raise TraceError(f"{name_or_path}: no such trace file, nor a shipped trace ({', '.join(trace_names())})")


@dataclass(frozen=True)
class TraceSelection:
    """Which requests of which trace, at what scale: what ``replay`` and ``whatif`` are given."""

    name_or_path: str
    scale: int = 1
    start: int = 0
    stop: int | None = None
    limit: int | None = None

    def load(self) -> tuple[Trace, Trace]:
        """The whole file as read, and the requests selected, scaled."""
        whole = read_trace(trace_path(self.name_or_path))
        return whole, whole.select(self.start, self.stop, self.limit).scaled(self.scale)


def read_trace(path: Path, block_tokens: int = BLOCK_TOKENS) -> Trace:
    """Every request of a Mooncake-format file (``.gz`` read as gzip)."""
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    requests: list[TraceRequest] = []
    with _open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            requests.append(_request(path, number, line, block_tokens))
    if not requests:
        raise TraceError(f"{path}: no requests")
    # in arrival order: the tap writes a request when it ends, so one that overlapped a later one comes after it
    return Trace(path.name, tuple(sorted(requests, key=lambda r: r.timestamp_ms)), block_tokens)


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _request(path: Path, number: int, line: str, block_tokens: int) -> TraceRequest:
    where = f"{path}: line {number}"
    try:
        data: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not a JSON object ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, Mapping):
        raise TraceError(f"{where}: not a JSON object")
    for name in FIELDS:
        if name not in data:
            raise TraceError(f"{where}: {name}: missing")
    numbers = {name: _count(where, name, data[name]) for name in FIELDS[:3]}
    ids = data["hash_ids"]
    if not isinstance(ids, list):
        raise TraceError(f"{where}: hash_ids: expected a list of block ids, got {type(ids).__name__}")
    for k, block in enumerate(ids):
        _count(where, f"hash_ids[{k}]", block)
    if numbers["input_length"] < 1:
        raise TraceError(f"{where}: input_length: a request has at least one token")
    blocks = math.ceil(numbers["input_length"] / block_tokens)
    if len(ids) != blocks:
        raise TraceError(f"{where}: hash_ids: {len(ids)} ids for input_length {numbers['input_length']}, which "
                         f"needs {blocks} blocks of {block_tokens} tokens")
    return TraceRequest(number, numbers["timestamp"], numbers["input_length"], numbers["output_length"], tuple(ids))


def _count(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: {name}: expected a whole number >= 0, got {json.dumps(value)[:40]}")
    return value
