"""One session: one profile variant at one size, on one server, all scenarios in order.

The session owns the server's lifetime, builds the documents with the server's
tokenizer, runs the scenarios, and writes one record per HTTP call as soon as it
ends. For every completion it also works out what a perfect cache would have
re-processed (``ideal``: the prompt tokens after the longest prefix the server has
already seen under the same LoRA setting), why the server did what it did (from
its log), and whether the output equals output computed without reuse. A
scenario that cannot run on the variant (no sleep configured, no LoRA loaded)
is announced with its reason and records nothing.

Faults: every completion has a deadline scaled from the prefill rate the first
load measured and the prompt's size; a call that fails (the server died, hung,
answered an error) is recorded with the server's exit status and a scrubbed log
tail, the process group of a hung server is killed, and the session stops
(``on_failure="stop"``, the default) or restarts the server and goes on with
the next scenario (``"continue"``). Every record written before stays as it is.

References (kept by ``verification.References``; "the same output" is
``verification.output_difference``): a reused step whose prompt has no no-reuse
computation yet is written at once and verified later: by any later call that computes the same
prompt and LoRA with nothing reused (a cold measured step is a reference), or
by a ``cache_prompt: false`` call at the end of the session. The record that
verifies lists the steps in ``extra["verifies"]``; ``records.read_records``
applies the verdicts. This keeps the prefill budget (all prefilled tokens over
the measured steps' own) as low as verification allows, and a reference never
changes the server state a later scenario starts from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from reusebench.config import corpus as corpus_mod
from reusebench.llama import binaries, facts, logs
from reusebench.reuse import expectation
from reusebench.machine import host
from reusebench.config import scenarios
from reusebench.llama.client import ClientError, Completion, ProgressCallback
from reusebench.machine.gpu import GpuSampler
from reusebench.llama.handle import ServerHandle
from reusebench.config.profiles import Variant
from reusebench.records import DEFAULT_LORA, PREFILL_ROLES, PrefillBudget, Record, RecordWriter, Role, lora_key, text_hash, tokens_hash, verdict
from reusebench.llama.server import LlamaServer, ServerError
from reusebench.reuse.verification import References, common_prefix, reference_name

CTX_MARGIN = 1024  # room for question, edit, extension and generated tokens beyond the document
# Deadline of one completion: max(HANG_FLOOR_S, HANG_FACTOR x prompt tokens / prefill rate + HANG_MARGIN_S
# + HANG_PER_TOKEN_S x n_predict).
# The rate is the first load's; before it is measured, UNMEASURED_RATE (tokens/s) stands in: report A's
# slowest 128K first load ran at ~90 tokens/s, so 100 gives a 128K first load ~87 minutes.
HANG_FLOOR_S = 60.0
HANG_FACTOR = 4.0
HANG_MARGIN_S = 30.0
UNMEASURED_RATE = 100.0
HANG_PER_TOKEN_S = 1.0  # per generated token
CALL_TIMEOUT_S = 300.0  # any other call (tokenize, props, templates); a slot save/restore gets a deadline as above
LOG_TAIL_LINES = 12  # scrubbed server log lines kept on a failed record
ON_FAILURE = ("stop", "continue")

Prompt = str | Sequence[int]
Lora = list[dict[str, float]] | None
Messages = scenarios.Messages


@dataclass
class SessionResult:
    session: str
    records: list[Record] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)  # scenario id -> why it did not run
    error: str | None = None  # the first failure (with on_failure="continue" the session went on after it)
    failures: list[str] = field(default_factory=list)
    budget: PrefillBudget | None = None
    timing: dict[str, float] = field(default_factory=dict)  # wall, server, load, wait, overhead seconds

    @property
    def overhead_fraction(self) -> float | None:
        wall = self.timing.get("wall_s")
        return self.timing["overhead_s"] / wall if wall else None

    def summary_line(self) -> str:
        """The prefill budget and the harness overhead, one line."""
        budget = self.budget.line() if self.budget else f"{self.session}: prefill budget n/a"
        fraction = self.overhead_fraction
        overhead = "" if fraction is None else (f"; harness overhead {self.timing['overhead_s']:.2f} s of "
                                                f"{self.timing['wall_s']:.1f} s ({100 * fraction:.1f}%)")
        return budget + overhead


@dataclass(frozen=True)
class Request:
    """One completion request, ready to send with or without reuse (the reference is the same call)."""

    endpoint: str
    tokens: list[int]  # the prompt as the server tokenizes it
    lora: Lora
    user_starts: tuple[int, ...]  # where user messages start (chat): the server may checkpoint there
    send: Callable[[bool, ProgressCallback | None, float], tuple[Completion, str]]  # (cache_prompt, progress,
    # timeout_s) -> (completion, reply)


# Fault injection and progress watching: (scenario, step, role, processed, cached, total) on every prompt-progress
# event. Tests pass one that kills or stops the real server when a prefill passes some fraction.
ProgressHook = Callable[[str, str, str, int, int, int], None]


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
        on_failure: str = "stop",
        progress_hook: ProgressHook | None = None,
        out: TextIO = sys.stderr,
    ) -> None:
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure: must be one of {', '.join(ON_FAILURE)}, got {on_failure!r}")
        self.variant = variant
        self.size = size
        self.spec = spec
        self.writer = writer
        self.run_id = run_id
        self.log_dir = log_dir
        self.sampler = sampler
        self.verify = verify
        self.on_failure = on_failure
        self.progress_hook = progress_hook
        self.out = out
        self.repeat = repeat  # which of several repeated sessions this is (--repeat-first-load), else None
        self.name = f"{variant.profile}/{variant.name}@{size}" + ("" if repeat is None else f"#r{repeat}")
        self._slot_dir: Path | None = None
        self.handle = ServerHandle(LlamaServer(variant.binary.path, self._server_args()),
                                   call_timeout_s=CALL_TIMEOUT_S)
        self.build = "unknown"
        self._tokens: dict[str, list[int]] = {}
        self._seen: dict[str, list[list[int]]] = {}  # lora key -> sequences the server has processed
        self._references: References[Request] = References()
        self._first_load_ms: float | None = None
        self._rate: float | None = None  # prefill tokens per second of the first load
        self._prefilled = dict.fromkeys(PREFILL_ROLES, 0)
        self._seconds = dict.fromkeys(("server", "load", "wait"), 0.0)
        self._corpus: dict[str, float] = {}
        self._last_slot = 0
        self._slot_sequence: tuple[str, list[int]] = (DEFAULT_LORA, [])  # what the last slot used holds
        self._saved: dict[str, tuple[str, list[int]]] = {}
        # what the server should do, request by request: from the GGUF and the launch options only
        self.expectation = expectation.ServerModel(*expectation.of_variant(variant))
        self._expected_saved: dict[str, expectation.Held] = {}
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
        started, started_at = time.monotonic(), time.time()
        try:
            self._check_slot_dir()
            # page-cache residency of the model means something only before the server maps it
            self._host_before_load = host.capture(self.variant.model).to_dict()
            self._start_server()
            self.build = binaries.build_label(self.variant.binary, self.handle.client.props().get("build_info"))
            building = time.monotonic()
            self.corpus = corpus_mod.build_corpus(self.spec, self.handle.client, self.size)
            self._corpus = {"corpus_s": time.monotonic() - building, "corpus_tokenizer_calls": self.corpus.tokenizer_calls}
            for scenario in selected:
                reason = scenario.not_applicable(self)
                if reason:
                    self.result.not_applicable[scenario.id] = reason
                    self._say(f"{scenario.id}: not applicable to this variant, nothing recorded: {reason}")
                    continue
                self._say(f"{scenario.id}: {scenario.title}")
                try:
                    scenario.run(self)
                except (ClientError, ServerError) as exc:
                    self._failed(f"{scenario.id}: {type(exc).__name__}: {exc}")
                    if self.on_failure == "stop":
                        break
                    self._recover()
            self._deferred_references()
        except (ClientError, ServerError) as exc:  # a CorpusError (bad input) ends the run: see cli
            self._failed(f"{type(exc).__name__}: {exc}")
        finally:
            self.close()
            self._account(started_at, time.monotonic() - started)
        return self.result

    def _failed(self, error: str) -> None:
        self.result.failures.append(error)
        self.result.error = self.result.error or error
        what = "going on with the next scenario" if self.on_failure == "continue" else "session stopped"
        self._say(f"{what}: {error}")

    def _recover(self) -> None:
        """After a failed scenario (on_failure="continue"): a fresh server if the old one is gone."""
        if self.server.is_running():
            return
        self._restart_server("restarting the server after the failure")
        self._slot_sequence, self._last_slot = (DEFAULT_LORA, []), 0
        self.expectation.restart()

    @property
    def server(self) -> LlamaServer:
        return self.handle.server

    def close(self) -> None:
        self._keep_log()
        stopping = time.monotonic()
        self.handle.close()
        self._seconds["load"] += time.monotonic() - stopping
        if self._slot_dir is not None:
            shutil.rmtree(self._slot_dir, ignore_errors=True)

    def _account(self, started_at: float, wall_s: float) -> None:
        """The prefill budget and the harness overhead (wall time not spent by the server or waiting on purpose),
        said in one line and kept as the session's summary record (role "session", no HTTP call)."""
        self.result.budget = PrefillBudget.of(self.name, self._prefilled)
        busy = self._seconds["server"] + self._seconds["load"] + self._seconds["wait"]
        self.result.timing = {"wall_s": wall_s, **{f"{k}_s": v for k, v in self._seconds.items()},
                              "overhead_s": max(0.0, wall_s - busy), **self._corpus}
        self._say(self.result.summary_line().removeprefix(f"{self.name}: "))
        if self.server.starts == 0:
            return  # failed before launch: no call was made, nothing to sum up
        record = self._base_record(Role.SESSION, "summary", Role.SESSION, "", started_at)
        record.status = None  # the failures are in extra: `error` is for the call that failed
        record.wall_ms = wall_s * 1000.0
        record.extra |= {"timing": self.result.timing, "prefill": self._prefilled,
                         "failures": self.result.failures, "not_applicable": self.result.not_applicable}
        self.writer.write(record)

    def _check_slot_dir(self) -> None:
        """A configured --slot-save-path must be a writable directory: say so before launch, not at the first save."""
        configured = self.variant.option("slot-save-path")
        if configured is None:
            return
        path = Path(str(configured))
        try:
            path.mkdir(parents=True, exist_ok=True)
            test_file = path / f".reusebench-write-test-{os.getpid()}"
            test_file.write_bytes(b"")
            test_file.unlink()
        except OSError as exc:
            raise ServerError(f"options.slot-save-path: {path} is not a writable directory "
                              f"({exc.strerror or exc}); nothing was started") from exc

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

    def number(self, name: str) -> float | None:
        return self.variant.number(name)

    def prompt(self, document: str, question: str) -> str:
        return corpus_mod.Corpus.prompt(document, question)

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        key = f"{bos}:{text_hash(text)}:{len(text)}"
        if key not in self._tokens:
            self._tokens[key] = self.handle.client.tokenize(text, add_special=bos)
        return self._tokens[key]

    def measure(self, scenario: str, step: str, prompt: Prompt, *, expect_hit: bool = True, lora: Lora = None) -> Completion:
        return self._complete(scenario, step, Role.MEASURE, self._completion(prompt, lora), expect_hit)[0]

    def setup(self, scenario: str, step: str, prompt: Prompt, *, lora: Lora = None) -> Completion:
        return self._complete(scenario, step, Role.SETUP, self._completion(prompt, lora), False)[0]

    def chat(self, scenario: str, step: str, messages: Messages, *, expect_hit: bool = True) -> str:
        """A measured ``/v1/chat/completions`` turn; returns the reply text for the next turn (never recorded)."""
        return self._complete(scenario, step, Role.MEASURE, self._chat(messages), expect_hit)[1]

    def save_slot(self, scenario: str, filename: str) -> None:
        self._saved[filename] = self._slot_sequence
        self._expected_saved[filename] = self.expectation.saved(self._last_slot)
        timeout = self._deadline(len(self._slot_sequence[1]))
        try:
            self._call(scenario, "save slot", f"/slots/{self._last_slot}?action=save",
                       lambda: self.handle.client.slot_save(self._last_slot, filename, timeout_s=timeout),
                       explain=lambda: self._save_failure(filename))
        except ClientError:
            del self._saved[filename]
            raise

    def restore_slot(self, scenario: str, filename: str) -> None:
        timeout = self._deadline(len(self._saved.get(filename, ("", []))[1]))
        self._call(scenario, "restore slot", f"/slots/{self._last_slot}?action=restore",
                   lambda: self.handle.client.slot_restore(self._last_slot, filename, timeout_s=timeout))
        key, sequence = self._saved[filename]
        self._seen.setdefault(key, []).append(sequence)
        self.expectation.restore(self._last_slot, self._expected_saved[filename])

    def wait_until_asleep(self, scenario: str) -> None:
        """Stay idle until the server sleeps (``ServerHandle.wait_until_asleep``); a server that does not fails."""
        seconds = self.variant.number("sleep-idle-seconds")
        self._say(f"  idling until the server sleeps (sleep-idle-seconds {seconds:g})")

        def wait() -> dict[str, Any]:
            waited = self.handle.wait_until_asleep(seconds)
            self._seconds["wait"] += waited.waited_s  # a deliberate wait, not harness overhead
            if not waited.asleep:
                raise ServerError(f"the server did not sleep within {waited.waited_s:.0f} s of idling")
            self.expectation.sleep()
            return {"n_polls": waited.polls}

        self._call(scenario, "idle until asleep", "/props", wait)

    def restart(self, scenario: str) -> None:
        self._restart_server("restarting the server (same slot-save directory)")
        self.expectation.restart()

    def _restart_server(self, message: str) -> None:
        self._say(f"  {message}")
        self._stop_server()
        self._host_before_load = host.capture(self.variant.model).to_dict()
        self._start_server()
        self._seen.clear()  # a perfect cache keeps only what was saved to disk across a restart

    # -- internals ------------------------------------------------------------------------------

    def _start_server(self) -> None:
        started = time.monotonic()
        try:
            self.handle.start()
        finally:
            self._seconds["load"] += time.monotonic() - started
        self.sampler.pid = self.server.pid

    def _stop_server(self) -> None:
        started = time.monotonic()
        self.handle.stop()
        self._seconds["load"] += time.monotonic() - started

    def _deadline(self, n_tokens: int) -> float:
        """Seconds one call on ``n_tokens`` prompt tokens may take before the server counts as hung."""
        rate = self._rate or UNMEASURED_RATE
        return max(HANG_FLOOR_S, HANG_FACTOR * n_tokens / rate + HANG_MARGIN_S
                   + HANG_PER_TOKEN_S * self.variant.n_predict)

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

    def _call(self, scenario: str, step: str, endpoint: str, action: Callable[[], dict[str, Any]],
              explain: Callable[[], str] | None = None) -> None:
        started = time.time()
        record = self._base_record(scenario, step, Role.SETUP, endpoint, started)
        try:
            response = action()
            record.extra |= {k: v for k, v in response.items() if k.startswith("n_") or k == "timings"}
        except ClientError as exc:
            why = explain() if explain and self.server.is_running() else ""
            raise self._fail(record, exc, why) from exc
        except ServerError as exc:
            record.status, record.error, record.ended_at = None, f"ServerError: {exc}", time.time()
            self.writer.write(record)
            raise
        record.ended_at = time.time()
        record.wall_ms = (record.ended_at - started) * 1000.0
        # slot files are server work: their time is not harness overhead
        timings = response.get("timings") or {}
        self._seconds["server"] += sum(float(v) for k, v in timings.items() if k.endswith("_ms")) / 1000.0
        self.writer.write(record)

    def _fail(self, record: Record, exc: ClientError, why: str = "") -> ClientError:
        """Record a failed call with what the server says about it; the error to raise.

        A call that timed out means a hung server: its process group is killed (no grace, it would not
        answer SIGTERM either). A server that is gone gives its exit status and a scrubbed log tail.
        """
        record.ended_at = time.time()
        record.wall_ms = (record.ended_at - record.started_at) * 1000.0
        message = str(exc) + (f" ({why})" if why else "")
        if "timed out" in str(exc) and self.server.is_running():
            self.server.kill_hard()
            record.extra["hung"] = True
            message += "; the server hung: its process group was killed"
        code = self._exit_status(2.0 if exc.status is None else 0.0)  # no HTTP answer: the server may be dying
        if code is not None:
            record.extra["exit_status"] = code
            message += f"; llama-server exited with status {code}"
        record.extra["log_tail"] = self.server.log_tail(LOG_TAIL_LINES)
        record.status, record.error = exc.status, message
        self.writer.write(record)
        return ClientError(message, exc.status)

    def _exit_status(self, wait_s: float = 2.0) -> int | None:
        """The server's exit status, waiting briefly for a process that is dying (a dropped connection comes first)."""
        if self.server.process is None:
            return None
        try:
            return self.server.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:  # still running
            return None

    def _save_failure(self, filename: str) -> str:
        """Why a slot save failed, as far as the harness can tell: a full disk, and no half-written file kept."""
        directory = self._slot_dir or Path(str(self.variant.option("slot-save-path")))
        partial = directory / filename
        try:
            free = shutil.disk_usage(directory).free
        except OSError as exc:
            return f"slot-save directory {directory}: {exc.strerror}"
        kept = partial.stat().st_size if partial.is_file() else 0
        state = "disk full" if free < (1 << 20) else "not a full disk"
        why = f"slot-save directory {directory}: {free:,} bytes free ({state})"
        if kept:
            partial.unlink()  # a truncated slot file would only fail a later restore
            why += f"; removed the partial slot file of {kept:,} bytes"
        return why

    def _completion(self, prompt: Prompt, lora: Lora) -> Request:
        # Sent as the token ids the session derived `ideal` from (the server's own tokenizer): the server prefills
        # exactly those, and spends no time tokenizing text outside its prompt time (~1 ms per 1K tokens here),
        # which would otherwise sit between the client's TTFT and the server's prompt_ms.
        tokens = self._prompt_tokens(prompt)

        def send(cache_prompt: bool, progress: ProgressCallback | None, timeout_s: float) -> tuple[Completion, str]:
            return self.handle.client.complete(tokens, n_predict=self.variant.n_predict, cache_prompt=cache_prompt,
                                               lora=lora, on_progress=progress, timeout_s=timeout_s), ""

        return Request("/completion", tokens, lora, (), send)

    def _chat(self, messages: Messages) -> Request:
        messages = [dict(m) for m in messages]  # a deferred reference must send this turn, not a later one
        def send(cache_prompt: bool, progress: ProgressCallback | None, timeout_s: float) -> tuple[Completion, str]:
            return self.handle.client.chat(messages, n_predict=self.variant.n_predict, cache_prompt=cache_prompt,
                                           on_progress=progress, timeout_s=timeout_s)

        # the server's own rendering, tokenized as it does (BOS added), so `ideal` compares what it compares
        tokens = self.tokens(self.handle.client.apply_template(messages))
        user_starts = expectation.user_starts(tokens, self.tokens(facts.CHATML_USER_START, bos=False))
        return Request("/v1/chat/completions", tokens, None, user_starts, send)

    def _complete(self, scenario: str, step: str, role: str, request: Request, expect_hit: bool) -> tuple[Completion, str]:
        key = lora_key(request.lora)
        started = time.time()
        record = self._base_record(scenario, step, role, request.endpoint, started)
        record.lora, record.prompt_tokens, record.prompt_hash = key, len(request.tokens), tokens_hash(request.tokens)
        record.ideal, record.expected_hit = self._ideal(request.tokens, key), expect_hit
        expected = self.expectation.complete(request.tokens, lora=request.lora, user_starts=request.user_starts)
        record.expected, record.cause_expected = expected.prompt_n, expected.cause
        if expected.wrong_output:
            record.extra["expected_wrong_output"] = True
        log_mark = self.handle.mark()
        record.host = self._host_before_load or host.capture().to_dict()
        self._host_before_load = None
        gpu_mark = self.sampler.mark()
        timeout = self._deadline(len(request.tokens))
        try:
            completion, reply = request.send(True, self._progress(scenario, step, role), timeout)
        except (ClientError, KeyboardInterrupt) as exc:
            self._clear_progress()
            record.cause = self._cause(log_mark)
            record.gpu = self.sampler.summary_dict(gpu_mark, self.sampler.mark())
            record.extra["timeout_s"] = round(timeout, 1)
            if isinstance(exc, KeyboardInterrupt):  # keep what the step got to, then stop
                record.status, record.error, record.ended_at = None, "interrupted (Ctrl-C)", time.time()
                self.writer.write(record)
                raise
            raise self._fail(record, exc) from exc
        record.gpu = self.sampler.summary_dict(gpu_mark, self.sampler.mark())
        self._clear_progress()
        self._fill(record, completion)
        record.cause = self._cause(log_mark)
        if record.slot is None:  # chat responses do not name the slot; the log does
            record.slot = record.cause.get("slot")
        self._last_slot = record.slot if record.slot is not None else self._last_slot
        self._slot_sequence = (key, request.tokens + completion.tokens)
        self.expectation.answered(completion.tokens)
        self._seen.setdefault(key, []).append(self._slot_sequence[1])
        self._prefilled[role] += completion.prompt_n
        try:
            if completion.cache_n == 0:  # computed without reuse: a reference itself, for earlier steps too
                self._use_as_reference(record, completion)
            if role == Role.MEASURE:
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
        self._seconds["server"] += (c.prompt_ms + c.predicted_ms) / 1000.0
        record.output_hash = tokens_hash(c.tokens)
        record.excess = None if record.ideal is None else c.prompt_n - record.ideal

    def _cause(self, mark: int) -> dict[str, Any]:
        return logs.explain(self.handle.events_since(mark)).to_dict()

    def _judge(self, record: Record, c: Completion, request: Request) -> None:
        """Speedup, correctness against a no-reuse reference (now or deferred), and the step's outcome (hit, partial,
        miss or WRONG OUTPUT; the record keeps it in its ``verdict`` field)."""
        if record.scenario == "first_load":
            self._first_load_ms = c.prompt_ms
            if c.prompt_ms > 0 and c.prompt_n > 0:
                self._rate = c.prompt_n / (c.prompt_ms / 1000.0)
        if self._first_load_ms and c.prompt_ms > 0:
            record.speedup = self._first_load_ms / c.prompt_ms
        # More reused than the longest prefix ever computed under this LoRA: state computed for something else
        # (another LoRA, or a chunk shifted out of its context), whatever the output says.
        foreign = c.cache_n - ((record.prompt_tokens or 0) - (record.ideal or 0))
        if foreign > 0:
            record.extra["foreign_reused"] = foreign
        record.verdict = verdict(record)
        if c.cache_n == 0 or not self.verify:
            return
        self._references.verify(record, c, request)

    def _use_as_reference(self, record: Record, c: Completion) -> None:
        """A call that reused nothing is the reference of its prompt; it verifies the steps waiting for one."""
        for measured in self._references.add(record, c):
            self._say(f"  {measured.scenario}/{measured.step}: verified by {reference_name(record)}: {measured.verdict}")

    def _deferred_references(self) -> None:
        """The references nothing computed along the way: one ``cache_prompt: false`` call per prompt and LoRA."""
        waiting = self._references.waiting()
        if waiting and not self.server.is_running():
            steps = sum(len(p.steps) for p in waiting)
            self._say(f"{steps} measured step(s) left unverified: the server is gone before their references")
            return
        for pending in waiting:
            first = pending.steps[0][0]
            record = self._base_record(first.scenario, first.step, Role.REFERENCE, pending.request.endpoint, time.time())
            record.lora, record.prompt_tokens, record.prompt_hash = first.lora, first.prompt_tokens, first.prompt_hash
            timeout = self._deadline(len(pending.request.tokens))
            try:
                reference, _ = pending.request.send(False, self._progress(first.scenario, first.step, Role.REFERENCE),
                                                    timeout)
            except ClientError as exc:
                self._clear_progress()
                raise self._fail(record, exc) from exc
            self._clear_progress()
            self._fill(record, reference)
            # a reference overwrites the slot like any request
            self.expectation.complete(pending.request.tokens, lora=pending.request.lora,
                                      user_starts=pending.request.user_starts, cache_prompt=False)
            self.expectation.answered(reference.tokens)
            self._prefilled[Role.REFERENCE] += reference.prompt_n
            self._use_as_reference(record, reference)
            self.writer.write(record)

    # -- output ---------------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        print(f"[{self.name}] {text}", file=self.out, flush=True)

    def _progress(self, scenario: str, step: str, role: str) -> Callable[[int, int, int], None] | None:
        tty, hook = self.out.isatty(), self.progress_hook
        if not tty and hook is None:
            return None

        def show(processed: int, cached: int, total: int) -> None:
            if hook is not None:
                hook(scenario, step, role, processed, cached, total)
            if tty:
                pct = 100.0 * processed / total if total else 100.0
                label = step if role != Role.REFERENCE else f"{step} (reference)"
                self.out.write(f"\r  {label}: prefill {pct:5.1f}% ({processed:,}/{total:,} tokens, {cached:,} cached)")
                self.out.flush()

        return show

    def _clear_progress(self) -> None:
        if self.out.isatty():
            self.out.write("\r\033[K")

    def _report_step(self, r: Record) -> None:
        label = "setup prefill" if r.role == Role.SETUP else (r.verdict or "")
        self._say(
            f"  {r.scenario}/{r.step}: re-processed {r.prompt_n:,} of {r.prompt_tokens:,} "
            f"(ideal {r.ideal:,}, expected {r.expected:,}) in {(r.prompt_ms or 0) / 1000:.2f} s  [{label}]  {r.cause['summary'] if r.cause else ''}"
        )

