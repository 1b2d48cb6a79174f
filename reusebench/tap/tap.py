"""The tap: the relay, and one record per recorded request, written through the suite's recording core.

A request's life: its body is read in memory (``exchange``); it goes upstream at once; beside it, the prompt's ids
are made (from the body, else through ``/apply-template`` and ``/tokenize`` on one worker thread, so the calls for
one conversation stay in order) and classed (``conversations``); each piece of the answer is read before it is
forwarded; once the client has the whole answer the task is found in the server's log (``TaskLog``: slot, prompt
length, server lifetime) and the record is written. Nothing of the text, the ids or the output reaches disk: the
records hold counts, positions and keyed hashes (``keys``).

The tap is a driver on the run loop (``run.loop.RunLoop``) whose source is real traffic: ``run`` relays until
``stop`` (SIGTERM, or the thread that started it) or Ctrl-C, then cuts what is in flight, records it as
interrupted, and writes the summary record last.

No text reaches a record, the summary or a message: a server's error is its status and a fixed class, the upstream's
credentials are redacted wherever it is named, unrecorded requests are counted by llama-server's own route names
(else "other"), and what the relay refuses is counted by a fixed reason.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import httpx

from reusebench.config import workload
from reusebench.llama import logs
from reusebench.llama.client import CONNECT_TIMEOUT_S, ONE_REQUEST_PER_CONNECTION, Completion
from reusebench.llama.log_tail import LogTail
from reusebench.llama.task_log import MAX_TASKS, Task, TaskLog
from reusebench.records import Extra, Record, Role, RunKind, interrupted, was_interrupted
from reusebench.reuse.perfect_cache import DEFAULT_MAX_TOKENS, PerfectCache
from reusebench.run import provenance
from reusebench.run.loop import RunLoop, RunResult
from reusebench.run.opening import opened_run
from reusebench.run.recording import Recorder, Source
from reusebench.tap import exchange
from reusebench.tap.conversations import DEFAULT_GAP_S, DEFAULT_PROBE_TOKENS, MAX_HELD_TOKENS, Conversations, Ticket
from reusebench.tap.exchange import Answer, Asked
from reusebench.tap.keys import Hasher, load_key
from reusebench.tap.naming import redacted, route_name
from reusebench.tap.relay import Relay, RelayLimits
from reusebench.tap.trace import TraceWriter

SCENARIO = workload.TAPPED  # the records' scenario and the summary's schedule
DEFAULT_LONG_PREFILL = 4096
CLAIM_WAIT_S = 5.0  # how long a finished request waits for its task's lines (a log-filter pipe may lag)
# how long a stop waits for the requests it cut to be recorded: the task's lines (CLAIM_WAIT_S) and the prompt's
# ids (at most 30 s) with room
STOP_WAIT_S = 60.0
AUTH_HEADERS = ("authorization", "x-api-key")
LEARN_RETRY_S = 60.0
@dataclass(frozen=True)
class HeldLimits:
    """What the tap holds in memory at most, beyond which the oldest goes first (counted in the summary's
    ``dropped``): ids of the live conversations' last prompts, ids of the sequences the perfect cache has seen, and
    the server log's tasks."""

    conversation_tokens: int = MAX_HELD_TOKENS
    ideal_tokens: int = DEFAULT_MAX_TOKENS
    tasks: int = MAX_TASKS


@dataclass(frozen=True)
class TapOptions:
    upstream: str
    listen: tuple[str, int]
    results: Path
    key_file: Path
    server_log: Path | None = None
    probe_tokens: int = DEFAULT_PROBE_TOKENS
    gap_s: float = DEFAULT_GAP_S
    long_prefill_tokens: int = DEFAULT_LONG_PREFILL
    claim_wait_s: float = CLAIM_WAIT_S
    limits: RelayLimits = RelayLimits()
    held: HeldLimits = HeldLimits()
    trace: Path | None = None  # also write the requests as a Mooncake-format trace (``tap.trace``)


@dataclass
class Tally:
    """What the summary record says beside the requests."""

    requests: int = 0
    interrupted: int = 0
    without_task: int = 0
    length_mismatches: int = 0
    tokenize_calls: int = 0
    tokenize_ms: float = 0.0
    tokenize_tokens: int = 0
    unclassed: int = 0
    unfinished_at_stop: int = 0  # cut at stop and still being read when the summary was written: not recorded
    refused: Counter[str] = field(default_factory=Counter)  # by the relay's fixed reasons
    not_understood: Counter[str] = field(default_factory=Counter)  # by the class of the problem


class Tap(RunLoop):
    """Relays `options.upstream` on `options.listen` and records what passes, on the run loop: ``run`` relays until
    ``stop`` (or Ctrl-C) and returns then; ``start`` runs it on a thread of its own and returns the address clients
    connect to."""

    def __init__(self, options: TapOptions, out: TextIO = sys.stderr) -> None:
        self.options = options
        self.hasher = Hasher(load_key(options.key_file, options.results))
        self.upstream_name = redacted(options.upstream)
        netloc = urlsplit(self.upstream_name).netloc
        self.run_dir, self.writer = opened_run(options.results, provenance.stamp(None, kind=RunKind.TAP, selection={
            "upstream": self.upstream_name, "listen": f"{options.listen[0]}:{options.listen[1]}"}))
        super().__init__(Recorder(self.writer, Source(SCENARIO, netloc, "unknown"), run=self.run_dir,
                                  session=f"{SCENARIO}/{netloc}", size=0, hash_tokens=self.hasher.tokens),
                         session="tap", out=out)
        self.result = RunResult(stopped_by="")
        held = options.held
        self.tasks = TaskLog(options.server_log, max_tasks=held.tasks) if options.server_log else None
        self.conversations = Conversations(probe_tokens=options.probe_tokens, gap_s=options.gap_s,
                                           seen=PerfectCache(held.ideal_tokens), max_tokens=held.conversation_tokens)
        self.tally = Tally()
        self.unrecorded_paths: Counter[str] = Counter()
        self.relay = Relay(options.upstream, options.listen, self, limits=options.limits)
        self.helper = httpx.Client(base_url=options.upstream.rstrip("/"), headers=ONE_REQUEST_PER_CONNECTION,
                                   timeout=httpx.Timeout(120.0, connect=CONNECT_TIMEOUT_S))
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tap-tokenize")  # in order: see above
        self.started_at = time.time()
        self.trace = None if options.trace is None else TraceWriter(options.trace, self.started_at)
        self.stopped_by = "the tap stopped"
        self._learned = False
        self._learn_after = 0.0  # monotonic seconds: when a failed learn may be tried again
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._serving: threading.Thread | None = None  # the relay's
        self._running: threading.Thread | None = None  # the loop's, when ``start`` runs it
        self._summary_record: Record | None = None

    # -- the loop ---------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._stop.is_set():  # stopped before it started: nothing to serve
            return
        for line in self.log_warnings():
            self.say(f"warning: {line}")
        self._serving = threading.Thread(target=self.relay.serve_forever, name="tap-relay", daemon=True)
        self._serving.start()
        self.say(f"relaying {self.relay.address} -> {self.upstream_name}; records -> {self.run_dir.records_path}")

    def _drive(self) -> None:
        """Relay until stopped; the build is learned from the first request (``learn_when_due``)."""
        self._stop.wait()

    def _absorbed(self, exc: BaseException) -> bool:
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C is how a tap usually ends
            self.stopped_by = "Ctrl-C"
            return True
        return False

    def _release(self) -> None:
        """Cut what is in flight (recorded as interrupted)."""
        if self._serving is None:  # stopped before it served
            self.relay.close()
            return
        self.tally.unfinished_at_stop = self.relay.stop(interrupted(self.stopped_by), wait_s=STOP_WAIT_S)
        self._serving.join()

    def _closed(self) -> None:
        self.worker.shutdown(wait=True)
        self.helper.close()

    def _summary(self, started_at: float) -> None:
        """The summary record last; then every id held is dropped."""
        self.result.stopped_by = self.stopped_by
        self._summary_record = self.recorder.summary(SCENARIO, started_at, self.result.wall_s, self.summary_extra())
        self.writer.close()
        if self.trace is not None:
            self.trace.close()
        self.conversations.clear()

    # -- start and stop from another thread -------------------------------------------------------

    def start(self) -> str:
        """Run the loop on a thread of its own, until ``stop``; the address clients connect to."""
        self._running = threading.Thread(target=self.run, name="tap", daemon=True)
        self._running.start()
        return self.relay.address

    def end(self, why: str) -> None:
        """Ask the run to end, from a signal handler or another thread; ``run`` returns once the summary is written."""
        self.stopped_by = why
        self._stop.set()

    def stop(self, why: str = "the tap stopped") -> Record:
        """End the run started by ``start`` (what is in flight is recorded as interrupted, the summary last); the
        summary record. A tap never started runs its loop here, which ends at once."""
        if self._summary_record is None:
            self.end(why)
            if self._running is None:
                self.run()
            else:
                self._running.join()
        assert self._summary_record is not None
        return self._summary_record

    def summary_extra(self) -> Extra:
        t = self.tally
        return {
            "schedule": SCENARIO, "requests": t.requests, "users": self.conversations.started,
            "sleeps": self.tasks.sleeps() if self.tasks else 0, "stopped_by": self.stopped_by, "gaps": [],
            "long_prefill_tokens": self.options.long_prefill_tokens,
            "system_prompt_tokens": self.conversations.shared_opening(),
            "upstream": self.upstream_name, "unrecorded": dict(self.unrecorded_paths),
            "refused": dict(t.refused), "not_understood": dict(t.not_understood),
            "dropped": {"conversations": self.conversations.dropped, "ideal_sequences": self.conversations.seen.dropped,
                        "tasks": self.tasks.dropped if self.tasks else 0,
                        "trace_blocks": self.trace.dropped if self.trace else 0},
            "interrupted": t.interrupted, "without_task": t.without_task, "length_mismatches": t.length_mismatches,
            "unclassed": t.unclassed, "unfinished_at_stop": t.unfinished_at_stop, "tokenize": {"calls": t.tokenize_calls, "ms": round(t.tokenize_ms, 3),
                                                   "tokens": t.tokenize_tokens},
            "server_lifetimes": self.tasks.lifetimes if self.tasks else 0,
            "log_warnings": self.log_warnings(),
        }

    def log_warnings(self) -> list[str]:
        """What the server log lacks for the causes: none given, missing, or without the ``-lv 4`` lines."""
        path = self.options.server_log
        if path is None:
            return ["no --server-log: the records carry counts but no causes"]
        if not path.is_file():
            return [f"--server-log {path}: no such file yet; the causes need llama-server's -lv 4 log there"]
        kinds = {e.kind for e in logs.parse_lines(LogTail(path).read_since(0))}
        if not kinds:
            return [f"--server-log {path}: no llama-server line the tap reads (run the server with -lv 4, "
                    "through `reusebench log-filter`)"]
        if "processing_task" in kinds and "new_prompt" not in kinds:
            return [f"--server-log {path}: tasks without their 'new prompt' lines: the server runs below -lv 4, "
                    "so no request can be paired with its task"]
        if self.tally.without_task:
            return [f"--server-log {path}: {self.tally.without_task} request(s) found no task in the log"]
        return []

    # -- the relay's observer ---------------------------------------------------------------------

    def observe(self, path: str, body: bytes) -> _Request:
        return _Request(self, path, body)

    def unrecorded(self, method: str, path: str) -> None:
        with self._lock:
            self.unrecorded_paths[route_name(method, path)] += 1

    def refused(self, reason: str) -> None:
        with self._lock:
            self.tally.refused[reason] += 1

    def failed(self, problem: str) -> None:
        with self._lock:
            self.tally.not_understood[problem] += 1

    def count(self, **added: float) -> None:
        """Add to the tally's counters, under its lock: requests are relayed on many threads."""
        with self._lock:
            for name, n in added.items():
                setattr(self.tally, name, getattr(self.tally, name) + n)

    @property
    def summary(self) -> Record | None:
        """The summary record, once the run has ended."""
        return self._summary_record

    @property
    def stopped(self) -> bool:
        """Whether the stop has written the summary: a request that ends later is counted there, not recorded."""
        return self._summary_record is not None

    def learn_when_due(self, headers: dict[str, str]) -> None:
        """Learn the build and the model on the worker, once, or again a minute after a failed look."""
        if not self._learned and time.monotonic() >= self._learn_after:
            self.worker.submit(self.learn_upstream, headers)

    def learn_upstream(self, headers: dict[str, str]) -> None:
        """The build and the model from /props (which wakes no server), with the first request's credentials."""
        with self._lock:
            if self._learned:
                return
            self._learned = True
        try:
            answer = self.helper.get("/props", headers=headers)
            answer.raise_for_status()  # a server still loading answers 503 with an error object
            props = answer.json()
            if not isinstance(props, dict):
                raise ValueError("not an object")
        except (httpx.HTTPError, ValueError):
            with self._lock:  # the upstream was down or odd: a request a minute from now tries again
                self._learned, self._learn_after = False, time.monotonic() + LEARN_RETRY_S
            return
        model = Path(str(props.get("model_path") or "unknown")).name
        self.recorder.source = Source(self.recorder.source.profile, self.recorder.source.variant, model)
        self.learn(str(props.get("build_info") or "unknown"))

    def sleeps(self) -> int:
        return self.tasks.sleeps() if self.tasks else 0


class _Request:
    """One recorded request in flight (``relay.Observed``)."""

    def __init__(self, tap: Tap, path: str, body: bytes) -> None:
        self.tap, self.path = tap, path
        self.started_at, self.t0 = time.time(), time.perf_counter()
        asked = exchange.read_asked(path, body)
        self.asked: Asked | None = asked if isinstance(asked, Asked) else None
        self.unclassed = None if self.asked is not None else str(asked)
        self.answer: Answer | None = None
        self.status: int | None = None
        self.ticket: Future[tuple[Ticket, exchange.Tokenized] | None] | None = None
        self.headers: dict[str, str] = {}
        self._ended_conversation = False

    def sending(self, headers: dict[str, str]) -> None:
        self.headers = {k: v for k, v in headers.items() if k.lower() in AUTH_HEADERS}
        tap = self.tap
        tap.learn_when_due(self.headers)
        if self.asked is None:
            return
        if self.asked.ids is not None:  # no server call needed: classed now, before the answer can come
            done: Future[tuple[Ticket, exchange.Tokenized] | None] = Future()
            done.set_result(self._classify(exchange.Tokenized(self.asked.ids, 0.0)))
            self.ticket = done
        else:
            self.ticket = tap.worker.submit(self._tokenize_and_classify)

    def _tokenize_and_classify(self) -> tuple[Ticket, exchange.Tokenized] | None:
        assert self.asked is not None
        try:
            made = exchange.tokenize(self.asked, self.tap.helper, self.headers)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.unclassed = f"the prompt could not be tokenized ({type(exc).__name__})"
            return None
        self.tap.count(tokenize_calls=1, tokenize_ms=made.ms, tokenize_tokens=len(made.ids))
        return self._classify(made)

    def _classify(self, made: exchange.Tokenized) -> tuple[Ticket, exchange.Tokenized]:
        return self.tap.conversations.classify(made.ids, sleeps=self.tap.sleeps(), now=time.monotonic()), made

    def answered(self, status: int) -> None:
        self.status = status
        streamed = bool(self.asked and self.asked.body.get("stream"))
        self.answer = Answer(streamed=streamed)

    def piece(self, data: bytes) -> None:
        assert self.answer is not None
        self.answer.feed(data)
        if self.answer.done and not self._ended_conversation:
            self._end_conversation()  # before the last piece reaches the client, which may send its next turn

    def _end_conversation(self) -> None:
        self._ended_conversation = True
        if self.ticket is None:
            return
        answer, ticket = self.answer, self.ticket
        ok = answer is not None and answer.done and answer.error is None
        ids = answer.ids if ok and answer is not None and answer.ids else None
        answered_n = int(answer.timings.get("predicted_n", 0)) if ok and answer is not None and ids is None else 0

        def end() -> None:
            found = ticket.result()
            if found is not None:
                self.tap.conversations.ended(found[0], ids, now=time.monotonic(), answered_n=answered_n)
        if ticket.done():
            end()
        else:
            self.tap.worker.submit(end)  # after its classing, on the worker

    def ended(self, error: str | None) -> None:
        tap = self.tap
        if tap.stopped:
            return  # after the stop's wait: counted in the summary's unfinished_at_stop, the writer is closed
        if self.answer is not None:
            self.answer.finish()
        if not self._ended_conversation:
            self._end_conversation()
        answer = self.answer
        found = None
        if self.ticket is not None:
            try:
                found = self.ticket.result(timeout=30.0)
            except Exception:  # the worker stopped with the tap
                found = None
        ticket, made = found if found is not None else (None, None)
        c = ticket.classed if ticket is not None else None
        endpoint = self.asked.endpoint if self.asked is not None else self.path
        classed = made is not None and c is not None
        record = tap.recorder.open(
            SCENARIO, c.kind if c else "unclassed", c.role if c else Role.MEASURE, endpoint, started=self.started_at,
            tokens=made.ids if classed and made is not None else None, lora=self.asked.lora if self.asked else None,
            ideal=c.ideal if c else None, status=self.status, user=c.user if c else None,
            turn=c.turn if c else None, expected_hit=c.expected_hit if c else None)
        if classed and made is not None and c is not None:
            record.extra.update(Extra(diverges_at=c.divergence, gap_s=None if c.gap_s is None else round(c.gap_s, 3),
                                      inserted=c.inserted, tokenize_ms=round(made.ms, 3)))
        else:
            record.extra["unclassed"] = self.unclassed or "no prompt read"
        complete = answer is not None and answer.done and answer.error is None
        tap.count(requests=1, interrupted=was_interrupted(error), unclassed=c is None)
        if not complete:
            tap.recorder.cut_short(record, (error if error else None) or (answer.error if answer is not None else None)
                                   or "the answer ended without its timings", self.status)
            return
        assert answer is not None
        task = tap.recorder.answered(record, self._completion(answer), self._claim, judged=c is not None)
        if task is not None:
            record.slot = task.slot if record.slot is None else record.slot
            record.extra["lifetime"] = task.lifetime
        if not answer.ids:
            record.output_hash = None  # no ids in the answer: nothing to hash but text, which the tap does not keep
        if record.prompt_tokens is not None and record.prompt_n is not None:
            served = record.prompt_n + (record.cache_n or 0)
            if served != record.prompt_tokens:
                record.extra["length_mismatch"] = {"tap": record.prompt_tokens, "server": served}
                tap.count(length_mismatches=1)
        tap.recorder.write(record)
        if tap.trace is not None and made is not None:
            tap.trace.write(self.started_at, made.ids, record.predicted_n or 0)

    def _claim(self, record: Record) -> Task | None:
        """The answer's task in the server's log, when the tap reads one (``--server-log``)."""
        tap = self.tap
        if tap.tasks is None or record.prompt_n is None:
            return None
        task = tap.tasks.claim(record.slot, record.prompt_n + (record.cache_n or 0), wait_s=tap.options.claim_wait_s)
        if task is None:
            tap.count(without_task=1)
        return task

    def _completion(self, answer: Answer) -> Completion:
        """The relayed answer's figures as a client's ``Completion``; its ids, when the answer had them."""
        t = answer.timings
        prompt_n, cache_n = int(t.get("prompt_n", 0)), int(t.get("cache_n", 0))
        ttft = None if answer.first_token_at is None else (answer.first_token_at - self.t0) * 1000.0
        return Completion(
            prompt_n=prompt_n, cache_n=cache_n, prompt_ms=float(t.get("prompt_ms", 0.0)),
            predicted_n=int(t.get("predicted_n", 0)), predicted_ms=float(t.get("predicted_ms", 0.0)),
            tokens_evaluated=prompt_n + cache_n, id_slot=answer.id_slot, ttft_ms=ttft,
            wall_ms=(time.perf_counter() - self.t0) * 1000.0, tokens=answer.ids)
