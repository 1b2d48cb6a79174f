"""One JSON line per HTTP call, appended and flushed as each call ends.

Records never hold prompt or output text: lengths and hashes only (report B: the
point of a content-free signal is that it can be written anywhere). A run that is
interrupted keeps every line it wrote; the reader skips a truncated last line
with a warning instead of failing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

SCHEMA_VERSION = 1

ROLES = ("setup", "measure", "reference")


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]


@dataclass
class Record:
    """One HTTP call of a session. Field names follow DESIGN.md's record schema."""

    run_id: str
    session: str
    profile: str
    variant: str
    build: str
    model: str
    size: int
    scenario: str
    step: str
    role: str
    endpoint: str
    started_at: float
    ended_at: float
    status: int | None = 200
    lora: str | None = None
    slot: int | None = None
    prompt_tokens: int | None = None
    prompt_hash: str | None = None
    prompt_n: int | None = None
    cache_n: int | None = None
    ideal: int | None = None
    excess: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    ttft_ms: float | None = None
    wall_ms: float | None = None
    speedup: float | None = None
    output_hash: str | None = None
    matches_reference: bool | None = None
    mismatch: str | None = None
    verdict: str | None = None
    expected_hit: bool | None = None
    cause: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    host: dict[str, Any] | None = None
    error: str | None = None
    schema: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RecordWriter:
    """Append-only JSONL file: every ``write`` is flushed and synced before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(self.path, "a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self._file.write(json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path) -> list[Record]:
    """Read a JSONL file back; a damaged line (e.g. cut by power loss) is skipped with a warning."""
    known = {f.name for f in dataclasses.fields(Record)}
    records: list[Record] = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{number}: skipped a damaged record line ({len(line)} bytes)", stacklevel=2)
                continue
            records.append(Record(**{k: v for k, v in data.items() if k in known}))
    return records


def read_many(paths: Iterable[Path]) -> list[Record]:
    return [record for path in paths for record in read_records(path)]
