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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO, TypedDict, cast

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


def _lora_key_of_v1(value: str | None) -> str | None:
    """A version 1 record's ``lora``: scenario runs wrote JSON pairs ("[[0, 1.0]]"), workloads "0:1"."""
    if value is None or not value.startswith("["):
        return value
    return lora_key([{"id": i, "scale": s} for i, s in json.loads(value)])

HIT_TOLERANCE = 8  # tokens over the ideal that still count as a hit (hybrids stop 4 tokens short)
# Tokens by which a measured prompt_n may differ from the reuse model's (reusebench.reuse.expectation) before the step
# is UNEXPECTED. Zero: the model works on the token ids the server is sent and the server's rules are integer
# arithmetic on them, so there is no noise to allow for; every token of difference is a rule the model lacks.
EXPECTED_TOLERANCE = 0


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


class RecordWriter:
    """Append-only JSONL file: every ``write`` is flushed to the OS before it returns, so a killed or
    interrupted run keeps every line; a background thread fsyncs right after (an fsync costs ~10 ms on some
    disks, which would otherwise add to every request), so at most the lines of the last moment can be
    lost to a power cut, and the reader skips a line cut short."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(self.path, "a", encoding="utf-8")
        self._dirty = threading.Event()
        self._closing = False
        self._syncer = threading.Thread(target=self._sync_loop, name="records-fsync", daemon=True)
        self._syncer.start()

    def write(self, record: Record) -> None:
        self._file.write(json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")
        self._file.flush()
        self._dirty.set()

    def _sync_loop(self) -> None:
        fd = self._file.fileno()
        while True:
            self._dirty.wait()
            self._dirty.clear()
            if self._closing:
                return
            try:
                os.fsync(fd)
            except OSError:
                return

    def close(self) -> None:
        if self._file.closed:
            return
        self._closing = True
        self._dirty.set()
        self._syncer.join()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def deviation(r: Record) -> int | None:
    """Measured minus expected prompt_n, when both are known."""
    return None if r.expected is None or r.prompt_n is None else r.prompt_n - r.expected


def interrupted(why: str = "Ctrl-C") -> str:
    """The error of a call cut short because its run stopped (Ctrl-C, SIGTERM, the tap stopped): one spelling for
    the session, the workload and the tap."""
    return f"interrupted ({why})"


def was_interrupted(error: str | None) -> bool:
    return bool(error) and str(error).startswith("interrupted (")


def outcome(r: Record, shared: int = 0) -> str:
    """The one rule for hit, partial and miss, for every report and page: a hit re-processed no more than
    HIT_TOLERANCE tokens over what a perfect cache would; a miss reused nothing beyond `shared` tokens (a system
    prompt every conversation of a service starts with; 0 for a scenario); partial lies between. Whether the turn
    should hit is the record's own ``expected_hit``."""
    if (r.excess or 0) <= HIT_TOLERANCE:
        return "hit"
    return "miss" if (r.cache_n or 0) <= shared else "partial"


def verdict(r: Record) -> str:
    """One word per measured step: hit, partial, miss, full (cannot hit), wrong output, foreign reuse,
    UNEXPECTED when prompt_n is not what the reuse model predicts (a wrong output outranks it: the
    report's output column and cause columns still show both), or NOT MODELLED where the model predicts nothing
    for this memory (``extra["not_modelled"]`` says why)."""
    if r.matches_reference is False:
        return "WRONG OUTPUT"
    if abs(deviation(r) or 0) > EXPECTED_TOLERANCE:
        return "UNEXPECTED"
    if r.extra.get("not_modelled"):
        return "NOT MODELLED"
    if r.extra.get("foreign_reused"):
        return "FOREIGN REUSE"
    if not r.expected_hit and (r.cache_n or 0) <= HIT_TOLERANCE:
        return "full (cannot hit)"
    return outcome(r)


def step_id(r: Record) -> dict[str, Any]:
    """What names one measured record inside its session, for ``extra["verifies"]``."""
    return {"scenario": r.scenario, "step": r.step, "started_at": r.started_at}


def apply_verification(measured: Record, check: dict[str, Any]) -> None:
    """Set a measured record's correctness fields from one entry of a reference's ``extra["verifies"]``."""
    measured.matches_reference = check["matches_reference"]
    measured.mismatch = check.get("mismatch")
    for name in ("output_check", "output_delta", "noise_band"):
        measured.extra[name] = check.get(name)
    measured.extra["verified_by"] = check.get("by")
    measured.verdict = verdict(measured)


def resolve_verifications(records: Sequence[Record]) -> None:
    """Apply every deferred verdict (``extra["verifies"]`` of a later record) to the measured record it names."""
    index = {(r.run_id, r.session, r.scenario, r.step, r.started_at): r for r in records if r.role == Role.MEASURE}
    for reference in records:
        for check in reference.extra.get("verifies") or ():
            target = index.get((reference.run_id, reference.session, check["scenario"], check["step"],
                                check["started_at"]))
            if target is not None:
                apply_verification(target, check)


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
