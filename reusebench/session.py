"""One session: one profile variant at one size, on one server, all scenarios in order.

The session owns the server's lifetime, builds the documents with the server's
tokenizer, runs the scenarios, and writes one record per HTTP call as soon as it
ends. For every completion it also works out what a perfect cache would have
re-processed (``ideal``: the prompt tokens after the longest prefix the server has
already seen under the same LoRA setting), why the server did what it did (from
its log), and whether the output equals output computed without reuse. A
scenario that cannot run on the variant (no sleep configured, no LoRA loaded)
is announced with its reason and records nothing.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from reusebench import corpus as corpus_mod
from reusebench import host, logs, scenarios
from reusebench.client import ClientError, Completion, LlamaClient, ProgressCallback
from reusebench.gpu import GpuSampler
from reusebench.profiles import Variant
from reusebench.records import Record, RecordWriter, text_hash, tokens_hash
from reusebench.server import LlamaServer, ServerError

CTX_MARGIN = 1024  # room for question, edit, extension and generated tokens beyond the document
HIT_TOLERANCE = 8  # tokens over the ideal that still count as a hit (hybrids stop 4 tokens short)
LOGPROB_TOLERANCE = 0.05  # absolute, on top-k logprobs; batch shapes differ between cold and reused paths
SLEEP_POLL_S = 0.25
SLEEP_GRACE_S = 60.0  # beyond sleep-idle-seconds before a server that does not sleep fails the session

Prompt = str | Sequence[int]
Lora = list[dict[str, float]] | None
Messages = scenarios.Messages


@dataclass
class SessionResult:
    session: str
    records: list[Record] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)  # scenario id -> why it did not run
    error: str | None = None


@dataclass(frozen=True)
class Request:
    """One completion request, ready to send with or without reuse (the reference is the same call)."""

    endpoint: str
    tokens: list[int]  # the prompt as the server tokenizes it
    lora: Lora
    send: Callable[[bool, ProgressCallback | None], tuple[Completion, str]]  # (cache_prompt, progress) -> (c, reply)


def reference_key(r: Record) -> tuple[str, str]:
    """Steps with the same prompt tokens and LoRA share one no-reuse reference."""
    return r.prompt_hash or "", r.lora or ""


def lora_key(lora: Lora) -> str:
    return "default" if lora is None else json.dumps(sorted((int(a["id"]), float(a["scale"])) for a in lora))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def compare_outputs(got: Completion, ref: Completion, tolerance: float = LOGPROB_TOLERANCE) -> str | None:
    """None when the outputs agree; otherwise where they first differ (positions and ids only, no text)."""
    for i, (a, b) in enumerate(zip(got.tokens, ref.tokens)):
        if a != b:
            return f"token {i}: id {a} != reference id {b}"
    if len(got.tokens) != len(ref.tokens):
        return f"length {len(got.tokens)} != reference {len(ref.tokens)}"
    for i, token, delta in logprob_deltas(got, ref):
        if delta > tolerance:
            return f"token {i}: top logprob of id {token} differs by {delta:.3f} (> {tolerance})"
    return None


def logprob_deltas(got: Completion, ref: Completion) -> list[tuple[int, int, float]]:
    """(position, token id, |logprob difference|) for every top-k token both outputs list at a position."""
    return [
        (i, token, abs(logprob - dict(pb.top)[token]))
        for i, (pa, pb) in enumerate(zip(got.probs, ref.probs))
        for token, logprob in pa.top
        if token in dict(pb.top)
    ]


class Session:
    """Runs the scenarios of one variant at one size and records every call."""

    def __init__(
        self,
        variant: Variant,
        size: int,
        spec: corpus_mod.CorpusSpec,
        writer: RecordWriter,
        *,
        run_id: str,
        log_dir: Path,
        sampler: GpuSampler,
        verify: bool = True,
        repeat: int | None = None,
        out: TextIO = sys.stderr,
    ) -> None:
        self.variant = variant
        self.size = size
        self.spec = spec
        self.writer = writer
        self.run_id = run_id
        self.log_dir = log_dir
        self.sampler = sampler
        self.verify = verify
        self.out = out
        self.repeat = repeat  # which of several repeated sessions this is (--repeat-first-load), else None
        self.name = f"{variant.profile}/{variant.name}@{size}" + ("" if repeat is None else f"#r{repeat}")
        self._slot_dir: Path | None = None
        self.server = LlamaServer(variant.binary.path, self._server_args(), env=variant.binary.environment())
        self.client: LlamaClient | None = None
        self.build = "unknown"
        self._tokens: dict[str, list[int]] = {}
        self._seen: dict[str, list[list[int]]] = {}  # lora key -> sequences the server has processed
        self._references: dict[tuple[str, str], Completion] = {}
        self._first_load_ms: float | None = None
        self._last_slot = 0
        self._slot_sequence: tuple[str, list[int]] = ("default", [])  # what the last slot used holds
        self._saved: dict[str, tuple[str, list[int]]] = {}
        self._host_before_load: dict[str, Any] | None = None
        self.result = SessionResult(self.name)

    # -- set-up -----------------------------------------------------------------------------

    def _server_args(self) -> list[str]:
        args = self.variant.server_args()
        if self.variant.option("ctx-size") is None:
            args += ["--ctx-size", str(self.size + CTX_MARGIN)]
        if self.variant.option("slot-save-path") is None:
            # restore_disk needs one; a private directory keeps slot files out of results/
            self._slot_dir = Path(tempfile.mkdtemp(prefix="reusebench-slots-"))
            args += ["--slot-save-path", str(self._slot_dir)]
        return args

    def run(self, selected: Sequence[scenarios.Scenario]) -> SessionResult:
        try:
            # page-cache residency of the model means something only before the server maps it
            self._host_before_load = host.capture(self.variant.model).to_dict()
            self._start_server()
            self.build = str(self._api().props().get("build_info", "unknown"))
            self.corpus = corpus_mod.build_corpus(self.spec, self._api(), self.size)
            for scenario in selected:
                reason = scenario.not_applicable(self)
                if reason:
                    self.result.not_applicable[scenario.id] = reason
                    self._say(f"{scenario.id}: not applicable to this variant, nothing recorded: {reason}")
                    continue
                self._say(f"{scenario.id}: {scenario.title}")
                scenario.run(self)
        except (ClientError, ServerError) as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"
            self._say(f"session stopped: {self.result.error}")
        finally:
            self.close()
        return self.result

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self._keep_log()
        self.server.close()
        if self._slot_dir is not None:
            shutil.rmtree(self._slot_dir, ignore_errors=True)

    def _keep_log(self) -> None:
        """Keep the scrubbed server log (numbers-only lines) beside the records."""
        raw = self.server.raw_log_path
        if not raw.exists():
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        kept = self.log_dir / (self.name.replace("/", "_").replace("@", "_") + ".log")
        with open(raw, errors="replace") as src, open(kept, "a") as dst:
            for line in src:
                scrubbed = logs.scrub_line(line.rstrip("\n"))
                if scrubbed:
                    dst.write(scrubbed + "\n")

    # -- the Steps protocol the scenarios use ---------------------------------------------------

    @property
    def document(self) -> str:
        return self.corpus.document

    @property
    def other(self) -> str:
        return self.corpus.other

    @property
    def edited(self) -> str:
        return self.corpus.edited

    @property
    def questions(self) -> tuple[str, str]:
        return self.corpus.questions

    @property
    def summary(self) -> str:
        return self.spec.summary

    @property
    def lora_adapters(self) -> int:
        return len(self.variant.lora)

    def option(self, name: str) -> object | None:
        return self.variant.option(name)

    def prompt(self, document: str, question: str) -> str:
        return corpus_mod.Corpus.prompt(document, question)

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        key = f"{bos}:{text_hash(text)}:{len(text)}"
        if key not in self._tokens:
            self._tokens[key] = self._api().tokenize(text, add_special=bos)
        return self._tokens[key]

    def measure(self, scenario: str, step: str, prompt: Prompt, *, expect_hit: bool = True, lora: Lora = None) -> Completion:
        return self._complete(scenario, step, "measure", self._completion(prompt, lora), expect_hit)[0]

    def setup(self, scenario: str, step: str, prompt: Prompt, *, lora: Lora = None) -> Completion:
        return self._complete(scenario, step, "setup", self._completion(prompt, lora), False)[0]

    def chat(self, scenario: str, step: str, messages: Messages, *, expect_hit: bool = True) -> str:
        """A measured ``/v1/chat/completions`` turn; returns the reply text for the next turn (never recorded)."""
        return self._complete(scenario, step, "measure", self._chat(messages), expect_hit)[1]

    def save_slot(self, scenario: str, filename: str) -> None:
        self._saved[filename] = self._slot_sequence
        self._call(scenario, "save slot", f"/slots/{self._last_slot}?action=save",
                   lambda: self._api().slot_save(self._last_slot, filename))

    def restore_slot(self, scenario: str, filename: str) -> None:
        self._call(scenario, "restore slot", f"/slots/{self._last_slot}?action=restore",
                   lambda: self._api().slot_restore(self._last_slot, filename))
        key, sequence = self._saved[filename]
        self._seen.setdefault(key, []).append(sequence)

    def wait_until_asleep(self, scenario: str) -> None:
        """Stay idle until the server sleeps, asking only ``/props`` (``/slots`` and ``/tokenize`` would wake it)."""
        seconds = float(str(self.variant.option("sleep-idle-seconds")))
        self._say(f"  idling until the server sleeps (sleep-idle-seconds {seconds:g})")

        def poll() -> dict[str, Any]:
            deadline = time.monotonic() + seconds + SLEEP_GRACE_S
            polls = 1
            while not self._api().props().get("is_sleeping"):
                if time.monotonic() > deadline:
                    raise ServerError(f"the server did not sleep within {seconds + SLEEP_GRACE_S:.0f} s of idling")
                time.sleep(SLEEP_POLL_S)
                polls += 1
            return {"n_polls": polls}

        self._call(scenario, "idle until asleep", "/props", poll)

    def restart(self, scenario: str) -> None:
        self._say("  restarting the server (same slot-save directory)")
        assert self.client is not None
        self.client.close()
        self.server.stop()
        self._host_before_load = host.capture(self.variant.model).to_dict()
        self._start_server()
        self._seen.clear()  # a perfect cache keeps only what was saved to disk across a restart

    # -- internals ------------------------------------------------------------------------------

    def _start_server(self) -> None:
        self.server.start()
        self.sampler.pid = self.server.pid
        self.client = LlamaClient(self.server.base_url, self.server.api_key)

    def _api(self) -> LlamaClient:
        if self.client is None:
            raise ServerError("server is not running")
        return self.client

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        return self.tokens(prompt) if isinstance(prompt, str) else list(prompt)

    def _ideal(self, tokens: list[int], key: str) -> int:
        """Tokens a perfect cache would re-process: those after the longest prefix already seen (at least 1)."""
        seen = max((common_prefix(tokens, s) for s in self._seen.get(key, [])), default=0)
        return max(1, len(tokens) - seen)

    def _base_record(self, scenario: str, step: str, role: str, endpoint: str, started: float) -> Record:
        return Record(
            run_id=self.run_id, session=self.name, profile=self.variant.profile, variant=self.variant.name,
            build=self.build, model=self.variant.model_spec, size=self.size, scenario=scenario, step=step,
            role=role, endpoint=endpoint, started_at=started, ended_at=time.time(), slot=self._last_slot,
            extra={} if self.repeat is None else {"repeat": self.repeat},
        )

    def _call(self, scenario: str, step: str, endpoint: str, action: Callable[[], dict[str, Any]]) -> None:
        started = time.time()
        record = self._base_record(scenario, step, "setup", endpoint, started)
        try:
            response = action()
            record.extra |= {k: v for k, v in response.items() if k.startswith("n_") or k == "timings"}
        except ClientError as exc:
            record.status, record.error = exc.status, str(exc)
            self.writer.write(record)
            raise
        record.ended_at = time.time()
        record.wall_ms = (record.ended_at - started) * 1000.0
        self.writer.write(record)

    def _completion(self, prompt: Prompt, lora: Lora) -> Request:
        def send(cache_prompt: bool, progress: ProgressCallback | None) -> tuple[Completion, str]:
            return self._api().complete(prompt, n_predict=self.variant.n_predict, cache_prompt=cache_prompt, lora=lora,
                                        on_progress=progress), ""

        return Request("/completion", self._prompt_tokens(prompt), lora, send)

    def _chat(self, messages: Messages) -> Request:
        def send(cache_prompt: bool, progress: ProgressCallback | None) -> tuple[Completion, str]:
            return self._api().chat(messages, n_predict=self.variant.n_predict, cache_prompt=cache_prompt,
                                    on_progress=progress)

        # the server's own rendering, tokenized as it does (BOS added), so `ideal` compares what it compares
        return Request("/v1/chat/completions", self.tokens(self._api().apply_template(messages)), None, send)

    def _complete(self, scenario: str, step: str, role: str, request: Request, expect_hit: bool) -> tuple[Completion, str]:
        key = lora_key(request.lora)
        started = time.time()
        record = self._base_record(scenario, step, role, request.endpoint, started)
        record.lora, record.prompt_tokens, record.prompt_hash = key, len(request.tokens), tokens_hash(request.tokens)
        record.ideal, record.expected_hit = self._ideal(request.tokens, key), expect_hit
        offset = self.server.log_size()
        record.host = self._host_before_load or host.capture().to_dict()
        self._host_before_load = None
        mark = self.sampler.mark()
        try:
            completion, reply = request.send(True, self._progress(step))
        except ClientError as exc:
            record.status, record.error, record.ended_at = exc.status, str(exc), time.time()
            record.cause = self._cause(offset)
            record.gpu = self.sampler.summary_dict(mark, self.sampler.mark())
            self.writer.write(record)
            raise
        record.gpu = self.sampler.summary_dict(mark, self.sampler.mark())
        self._clear_progress()
        self._fill(record, completion)
        record.cause = self._cause(offset)
        if record.slot is None:  # chat responses do not name the slot; the log does
            record.slot = record.cause.get("slot")
        self._last_slot = record.slot if record.slot is not None else self._last_slot
        self._slot_sequence = (key, request.tokens + completion.tokens)
        self._seen.setdefault(key, []).append(self._slot_sequence[1])
        try:
            if role == "measure":
                self._judge(record, completion, request)
        finally:  # a failed reference call must not lose the measurement
            self.writer.write(record)
            self.result.records.append(record)
        self._report_step(record)
        return completion, reply

    def _fill(self, record: Record, c: Completion) -> None:
        record.ended_at = time.time()
        record.slot = c.id_slot
        record.prompt_n, record.cache_n, record.prompt_ms = c.prompt_n, c.cache_n, c.prompt_ms
        record.predicted_n, record.predicted_ms = c.predicted_n, c.predicted_ms
        record.ttft_ms, record.wall_ms = c.ttft_ms, c.wall_ms
        record.output_hash = tokens_hash(c.tokens)
        record.excess = None if record.ideal is None else c.prompt_n - record.ideal

    def _cause(self, offset: int) -> dict[str, Any]:
        with open(self.server.raw_log_path, errors="replace") as log:
            log.seek(offset)
            lines = log.read().splitlines()
        return logs.explain(logs.parse_lines(lines)).to_dict()

    def _judge(self, record: Record, c: Completion, request: Request) -> None:
        """Speedup, correctness against a no-reuse reference, and the verdict."""
        if record.scenario == "first_load":
            self._first_load_ms = c.prompt_ms
        if self._first_load_ms and c.prompt_ms > 0:
            record.speedup = self._first_load_ms / c.prompt_ms
        # More reused than the longest prefix ever computed under this LoRA: state computed for something else
        # (another LoRA, or a chunk shifted out of its context), whatever the output says.
        foreign = c.cache_n - ((record.prompt_tokens or 0) - (record.ideal or 0))
        if foreign > 0:
            record.extra["foreign_reused"] = foreign
        if c.cache_n == 0:
            self._references.setdefault(reference_key(record), c)  # computed without reuse: a reference itself
        elif self.verify:
            reference = self._references.get(reference_key(record)) or self._reference(record, request)
            record.mismatch = compare_outputs(c, reference)
            record.matches_reference = record.mismatch is None
            # how close "same" was: the tolerance is for batch-shape noise, which is ~1e-5 on CPU
            record.extra["max_logprob_delta"] = max((d for _, _, d in logprob_deltas(c, reference)), default=0.0)
        record.verdict = verdict(record)

    def _reference(self, measured: Record, request: Request) -> Completion:
        """The same request without reuse (``cache_prompt: false``). It leaves the slot holding the same tokens."""
        record = self._base_record(measured.scenario, measured.step, "reference", request.endpoint, time.time())
        record.lora, record.prompt_tokens, record.prompt_hash = measured.lora, measured.prompt_tokens, measured.prompt_hash
        reference, _ = request.send(False, self._progress("reference"))
        self._clear_progress()
        self._fill(record, reference)
        self.writer.write(record)
        self._references[reference_key(measured)] = reference
        return reference

    # -- output ---------------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        print(f"[{self.name}] {text}", file=self.out, flush=True)

    def _progress(self, step: str) -> Callable[[int, int, int], None] | None:
        if not self.out.isatty():
            return None

        def show(processed: int, cached: int, total: int) -> None:
            pct = 100.0 * processed / total if total else 100.0
            self.out.write(f"\r  {step}: prefill {pct:5.1f}% ({processed:,}/{total:,} tokens, {cached:,} cached)")
            self.out.flush()

        return show

    def _clear_progress(self) -> None:
        if self.out.isatty():
            self.out.write("\r\033[K")

    def _report_step(self, r: Record) -> None:
        label = "setup prefill" if r.role == "setup" else (r.verdict or "")
        self._say(
            f"  {r.scenario}/{r.step}: re-processed {r.prompt_n:,} of {r.prompt_tokens:,} "
            f"(ideal {r.ideal:,}) in {(r.prompt_ms or 0) / 1000:.2f} s  [{label}]  {r.cause['summary'] if r.cause else ''}"
        )


def verdict(r: Record) -> str:
    """One word per measured step: hit, partial, miss, full (cannot hit), wrong output, foreign reuse."""
    if r.matches_reference is False:
        return "WRONG OUTPUT"
    if r.extra.get("foreign_reused"):
        return "FOREIGN REUSE"
    if not r.expected_hit and (r.cache_n or 0) <= HIT_TOLERANCE:
        return "full (cannot hit)"
    if not r.cache_n:
        return "miss"
    if (r.excess or 0) <= HIT_TOLERANCE:
        return "hit"
    return "partial"
