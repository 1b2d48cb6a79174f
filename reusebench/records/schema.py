"""The record's schema: ``Record`` and its columns, ``Extra`` (what a record carries beside them), ``Role``, the
schema's version, the one text form of a LoRA setting, and the hashes a record holds instead of text.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict, cast

# 2: ``lora`` is one format for every driver (``lora_key``); version 1 records of scenario runs held it as JSON
# pairs, and ``read_records`` converts them.
# 3: a verified step's ``extra`` says ``output_check`` (identical, within noise or WRONG), ``output_delta`` and
# ``noise_band`` (``reuse.verification``) where version 2 held ``max_logprob_delta``; role "noise" records the
# band's computations.
SCHEMA_VERSION = 3


class Role(StrEnum):
    """Why a record's call was made. A ``StrEnum``: a record read back from JSON compares equal by its text."""

    SETUP = "setup"  # puts the server in the state a measured step starts from
    MEASURE = "measure"  # a measured step (a scenario's, or a workload user's turn)
    REFERENCE = "reference"  # a no-reuse computation of a measured prompt, for its output
    PROBE = "probe"  # a workload's health check: no turn of a conversation
    # A no-reuse computation of a measured prompt at another batch shape, on a second server: the noise band its
    # reused outputs are judged against (not part of the prefill budget, which counts what the session costs).
    NOISE = "noise"
    # One record per session that is no HTTP call: its timing (wall, server, loads, waits, harness overhead,
    # corpus building) and prefill tokens by role, in ``extra``.
    SESSION = "session"


DEFAULT_LORA = "default"  # the LoRA key of a request without a ``lora`` field: the server's launch scales

Lora = Sequence[Mapping[str, float]] | None  # a request's ``lora`` field: [{"id": 0, "scale": 1.0}, ...]


def lora_key(lora: Lora) -> str:
    """The one text form of a request's LoRA setting, as ``Record.lora`` keeps it: "id:scale" per adapter, by
    id ("0:1,1:0.5"), or "default" for a request that sends none."""
    if lora is None:
        return DEFAULT_LORA
    return ",".join(f"{int(a['id'])}:{float(a['scale']):g}" for a in sorted(lora, key=lambda a: int(a["id"])))


def lora_scales(key: str | None) -> dict[int, float] | None:
    """Adapter id -> scale of a ``lora_key``; None for "default" (or no key)."""
    if key is None or key == DEFAULT_LORA:
        return None
    return {int(i): float(s) for i, s in (pair.split(":") for pair in key.split(",") if pair)}


def lora_applied(key: str | None) -> bool:
    """Some adapter runs at a non-zero scale (the launch default counts as applied: it is scale 1)."""
    scales = lora_scales(key)
    return scales is None or any(scale != 0 for scale in scales.values())


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def tokens_hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    """The whole sha256 of a file (models, executables), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Extra(TypedDict, total=False):
    """What a record carries beside its columns, under the names its readers use. Each key is one driver's: most
    records carry a few."""

    # every driver
    repeat: int  # which of repeated sessions or runs wrote it
    diverges_at: int | None  # where the prompt first differs from what its slot held (a position)
    draft_n: int  # speculative decoding: tokens drafted for this answer (the server's timings)
    draft_accepted: int  # ... and of them accepted
    # prompts with images (the corpus's ``images:``)
    image: dict[str, Any]  # an image-size call: the image's digest, pixels and bytes (never the image)
    images_sent: int  # images in the prompt
    image_spans: list[list[int]]  # each image's [start, tokens] in the prompt (what the server encoded: the cause)
    # the session
    slot_from: str  # "disk": the slot was restored from a file just before
    expected_wrong_output: bool  # the reuse model knows the reused state to be foreign
    not_modelled: str  # why the reuse model predicts nothing for this model's memory (its architecture, what lacks)
    foreign_reused: int  # tokens reused beyond the longest prefix ever computed under this LoRA
    prefill_seconds: str  # why a step stopped at its count has no prefill seconds
    timeout_s: float  # a failed completion's deadline
    hung: bool
    exit_status: int
    log_tail: str  # the scrubbed server log (numbers only) of a failed call
    reference: str  # "deferred": verified by a later no-reuse call
    verifies: list[dict[str, Any]]  # a reference's or the band's verdicts for earlier steps (``step_id`` + check)
    output_check: str | None  # identical, within noise, WRONG (schema 3)
    output_delta: float
    noise_band: float
    verified_by: str | None
    n_ubatch: int  # a noise-band call's ubatch
    band_sample: float  # its difference from the reference
    # a slot action's answer (save, restore, erase) and a wait for sleep
    n_saved: int
    n_written: int
    n_restored: int
    n_read: int
    n_erased: int
    n_polls: int
    timings: dict[str, float]
    # the call's task in the server's log (``Recorder.attach_task``)
    task: int | None
    displaced: list[int]
    idle_saved: list[int]
    evicted_mib: list[float]
    checkpoints_erased_old: int
    lifetime: int
    # a workload's calls
    in_flight: list[str]
    # the tap's records
    gap_s: float | None
    inserted: int | None  # tokens a head insert put before the conversation's kept part
    tokenize_ms: float
    unclassed: str | int  # a record: why it could not be classed; the tap's summary: how many could not
    length_mismatch: dict[str, int]
    # a session's summary record (role "session")
    timing: dict[str, float]
    prefill: dict[str, int]
    failures: list[str]
    not_applicable: dict[str, str]
    noise: dict[str, float]
    # a workload's or the tap's summary record
    schedule: str
    sleeps: int
    gaps: list[tuple[float, float]]
    stopped_by: str
    requests: int
    users: int
    long_prefill_tokens: int
    system_prompt_tokens: int
    upstream: str  # its credentials redacted
    unrecorded: dict[str, int]  # by "METHOD /route", llama-server's route names or "other"
    refused: dict[str, int]  # what the relay did not forward, by its fixed reason (not origin-form, body too large, ...)
    not_understood: dict[str, int]  # requests relayed whose reading failed, by the class of the problem
    dropped: dict[str, int]  # what the tap let go for its memory bounds: conversations, ideal sequences, tasks
    unfinished_at_stop: int  # requests the tap cut at stop whose records came after its summary: not written
    interrupted: int
    without_task: int
    length_mismatches: int
    tokenize: dict[str, float]
    server_lifetimes: int
    log_warnings: list[str]
    # a trace replay's records (``run.replay``) and its summary
    trace: str  # the trace file's name
    mode: str  # "serial" or "timed at Nx"
    line: int  # the request's line in the trace file
    arrival_ms: int  # its arrival time in the trace
    answer_forced: bool  # every answer token was the forced one (else the model was told another slot content)
    skipped_too_long: int
    block_tokens: int
    slot_context: int
    ram_cache: bool
    ideal: int | None  # the sums over the requests sent
    expected: int | None
    expected_by_class: dict[str, int]  # the expected tokens over the ideal, by where served (``Served``'s words)


SLOT_ANSWER_KEYS = ("n_saved", "n_written", "n_restored", "n_read", "n_erased", "n_polls", "timings")


def slot_answer(response: dict[str, Any]) -> Extra:
    """What a record keeps of a slot action's answer (or of a wait for sleep): its counts and timings."""
    return cast(Extra, {key: response[key] for key in SLOT_ANSWER_KEYS if key in response})


@dataclass
class Record:
    """One HTTP call of a session (or, with role "session", the session's summary)."""

    run_id: str
    session: str
    profile: str
    variant: str
    build: str
    model: str
    size: int
    scenario: str
    step: str
    role: str  # a Role
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
    prefilled_n: int | None = None  # tokens the server really prefilled: prompt_n, less for a step stopped early
    ideal: int | None = None
    excess: int | None = None
    expected: int | None = None  # prompt_n the reuse model predicts (reusebench.reuse.expectation)
    cause_expected: str | None = None  # and why
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
    user: str | None = None  # a workload's user ("chat-3", "health check"); None in scenario runs
    turn: int | None = None  # that user's turn, from 1
    schema: int = SCHEMA_VERSION
    extra: Extra = field(default_factory=lambda: Extra())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
