"""Reading records back: a records file (a damaged line skipped, version 1 converted, deferred verdicts applied),
several files, and the sessions that failed.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterable
from pathlib import Path

from reusebench.records.schema import Record, Role, lora_key
from reusebench.records.verdicts import resolve_verifications


def _lora_key_of_v1(value: str | None) -> str | None:
    """A version 1 record's ``lora``: scenario runs wrote JSON pairs ("[[0, 1.0]]"), workloads "0:1"."""
    if value is None or not value.startswith("["):
        return value
    return lora_key([{"id": i, "scale": s} for i, s in json.loads(value)])


def failed_sessions(records: Iterable[Record]) -> dict[tuple[str, str], str]:
    """(run id, session) -> its first failure, for every session that had one: a call that failed, or the
    failures its summary record lists (a server that died at start-up leaves nothing else)."""
    failed: dict[tuple[str, str], str] = {}
    for r in records:
        if r.error:
            failed.setdefault((r.run_id, r.session), f"{r.scenario}/{r.step}: {r.error}")
        elif r.role == Role.SESSION and r.extra.get("failures"):
            failed.setdefault((r.run_id, r.session), r.extra["failures"][0])
    return failed


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
            if data.get("schema", 1) == 1:
                data["lora"] = _lora_key_of_v1(data.get("lora"))
            records.append(Record(**{k: v for k, v in data.items() if k in known}))
    resolve_verifications(records)
    return records


def read_many(paths: Iterable[Path]) -> list[Record]:
    return [record for path in paths for record in read_records(path)]
