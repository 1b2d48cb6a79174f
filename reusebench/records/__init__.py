"""One JSON line per HTTP call, appended and flushed as each call ends.

Records never hold prompt or output text: lengths and hashes only (report B: the
point of a content-free signal is that it can be written anywhere). A run that is
interrupted keeps every line it wrote; the reader skips a truncated last line
with a warning instead of failing.

The file is append-only, so a measured step is written before it is verified
when its no-reuse reference is computed later in the session (deferred, or
taken from a later cold computation of the same prompt). The record that
serves as the reference then lists what it verified in ``extra["verifies"]``,
and the reader applies those verdicts back to the measured records.

- ``schema``: ``Record``, ``Extra``, ``Role``, the schema's version, the LoRA key, the text and token hashes;
- ``writer``: ``RecordWriter``, the append-only file;
- ``verdicts``: hit, partial or miss, the verdict word, an interrupted call's error, the deferred verifications;
- ``reading``: a records file read back (version 1 converted, verifications applied), the sessions that failed.
"""

from __future__ import annotations

from reusebench.records.reading import failed_sessions, read_many, read_records
from reusebench.records.run_kind import RunKind
from reusebench.records.schema import (
    DEFAULT_LORA,
    SCHEMA_VERSION,
    SLOT_ANSWER_KEYS,
    Extra,
    Lora,
    Record,
    Role,
    file_sha256,
    lora_applied,
    lora_key,
    lora_scales,
    slot_answer,
    text_hash,
    tokens_hash,
)
from reusebench.records.served import Served, served, served_by_log
from reusebench.records.verdicts import (
    EXPECTED_TOLERANCE,
    HIT_TOLERANCE,
    Drafts,
    StepVerdict,
    apply_verification,
    deviation,
    drafts,
    drafts_rolled_back,
    images_reprocessed,
    interrupted,
    outcome,
    resolve_verifications,
    step_id,
    verdict,
    was_interrupted,
)
from reusebench.records.writer import RecordWriter

__all__ = [
    "DEFAULT_LORA",
    "EXPECTED_TOLERANCE",
    "HIT_TOLERANCE",
    "SCHEMA_VERSION",
    "SLOT_ANSWER_KEYS",
    "Drafts",
    "Extra",
    "Lora",
    "Record",
    "RecordWriter",
    "Role",
    "RunKind",
    "Served",
    "StepVerdict",
    "apply_verification",
    "deviation",
    "drafts",
    "drafts_rolled_back",
    "images_reprocessed",
    "failed_sessions",
    "file_sha256",
    "interrupted",
    "lora_applied",
    "lora_key",
    "lora_scales",
    "outcome",
    "read_many",
    "read_records",
    "resolve_verifications",
    "served",
    "served_by_log",
    "slot_answer",
    "step_id",
    "text_hash",
    "tokens_hash",
    "verdict",
    "was_interrupted",
]
