"""The tap: the relay, and one record per recorded request, written through the suite's recording core.

A request's life: its body is read in memory (``exchange``); it goes upstream at once; beside it, the prompt's ids
are made (from the body, else through ``/apply-template`` and ``/tokenize`` on one worker thread, so the calls for
one conversation stay in order) and classed (``conversations``); each piece of the answer is read before it is
forwarded; once the client has the whole answer the task is found in the server's log (``TaskLog``: slot, prompt
length, server lifetime) and the record is written. Nothing of the text, the ids or the output reaches disk: the
records hold counts, positions and keyed hashes (``keys``).

The tap is a driver on the run loop (``run.loop.RunLoop``) whose source is real traffic: ``run`` relays until
Ctrl-C (the command turns SIGTERM into it) or ``end``, or ``stop`` from the thread that called ``start``; then it
cuts what is in flight, records it as interrupted, and writes the summary record last.

No text reaches a record, the summary or a message: a server's error is its status and a fixed class, the upstream's
credentials are redacted wherever it is named, unrecorded requests are counted by llama-server's own route names
(else "other"), and what the relay refuses is counted by a fixed reason.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import httpx

from reusebench.llama.client import CONNECT_TIMEOUT_S, ONE_REQUEST_PER_CONNECTION
from reusebench.llama.task_log import MAX_TASKS, TaskLog
from reusebench.records import Extra, Record, RunKind, interrupted
from reusebench.reuse.perfect_cache import DEFAULT_MAX_TOKENS, PerfectCache
from reusebench.run import provenance
from reusebench.run.loop import RunLoop, RunResult
from reusebench.run.opening import opened_run
from reusebench.run.recording import Recorder, Source
from reusebench.run.settings import DEFAULT
from reusebench.tap.conversations import DEFAULT_GAP_S, DEFAULT_PROBE_TOKENS, MAX_HELD_TOKENS, Conversations
from reusebench.tap.keys import Hasher, load_key
from reusebench.tap.naming import redacted, route_name
from reusebench.tap.relay import Relay, RelayLimits
from reusebench.tap.request import SCENARIO, Request
from reusebench.tap.trace import TraceWriter

DEFAULT_LONG_PREFILL = 4096
# how long a finished request waits for its task's lines: beside the other requests in flight (a log-filter pipe
# may lag too)
CLAIM_WAIT_S = DEFAULT.claim_wait_s(alone=False)
# how long a stop waits for the requests it cut to be recorded: the task's lines (CLAIM_WAIT_S) and the prompt's
# ids (at most 30 s) with room
STOP_WAIT_S = 60.0
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
    """Relays `options.upstream` on `options.listen` and records what passes, on the run loop, once: ``run`` relays
    until Ctrl-C or ``end`` and returns then; ``start`` runs it on a thread of its own, returns the address clients
    connect to, and ``stop`` ends it."""

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
        self.claim_wait_s = options.claim_wait_s
        self.unrecorded_paths: Counter[str] = Counter()
        self.relay = Relay(options.upstream, options.listen, self, limits=options.limits)
        self.helper = httpx.Client(base_url=options.upstream.rstrip("/"), headers=ONE_REQUEST_PER_CONNECTION,
                                   timeout=httpx.Timeout(120.0, connect=CONNECT_TIMEOUT_S))
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tap-tokenize")  # in order: see above
        self.started_at = time.time()
        self.trace = None if options.trace is None else TraceWriter(options.trace, self.started_at)
        self._why: str | None = None  # why the run ended: the first reason given wins
        self._learned = False
        self._learn_after = 0.0  # monotonic seconds: when a failed learn may be tried again
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._began = False  # the loop runs once
        self._ready = threading.Event()  # the relay serves, or the start failed
        self._done = threading.Event()  # the summary is written
        self._failure: BaseException | None = None
        self._serving: threading.Thread | None = None  # the relay's
        self._summary_record: Record | None = None

    @property
    def stopped_by(self) -> str:
        return self._why or "the tap stopped"

    def ending(self, why: str) -> None:
        """Name why the run ends, unless a reason is named already; takes no lock, so a signal handler may call it."""
        if self._why is None:
            self._why = why

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> RunResult:
        if not self._claim():
            raise RuntimeError("a tap runs once")
        return self._run_claimed()

    def _claim(self) -> bool:
        with self._lock:
            began, self._began = self._began, True
        return not began

    def _run_claimed(self) -> RunResult:
        try:
            return super().run()
        finally:
            self._ready.set()
            self._done.set()

    def _run_in_background(self) -> None:
        try:
            self._run_claimed()
        except BaseException as exc:  # ``start`` or ``stop`` raises it to the caller
            if self._failure is None:
                self._failure = exc

    def _start(self) -> None:
        if self._stop.is_set():  # stopped before it started: nothing to serve
            return
        for line in self.log_warnings():
            self.say(f"warning: {line}")
        self._serving = threading.Thread(target=self.relay.serve_forever, name="tap-relay", daemon=True)
        self._serving.start()
        self.say(f"relaying {self.relay.address} -> {self.upstream_name}; records -> {self.run_dir.records_path}")
        self._ready.set()

    def _drive(self) -> None:
        """Relay until stopped; the build is learned from the first request (``learn_when_due``)."""
        self._stop.wait()

    def _absorbed(self, exc: BaseException) -> bool:
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C (or SIGTERM, which the command turns into it) ends a tap
            self.ending("Ctrl-C")
            return True
        self._failure = exc
        self.ending(self.result.stopped_by)  # "failed: ...", for the summary and the requests it cuts
        return False

    def _release(self) -> None:
        """Cut what is in flight (recorded as interrupted)."""
        if self._serving is None:  # stopped before it served
            self.relay.close()
            return
        try:
            self.tally.unfinished_at_stop = self.relay.stop(interrupted(self.stopped_by), wait_s=STOP_WAIT_S)
        except BaseException:
            self.relay.close()  # the wait was cut before the relay closed: release the socket all the same
            raise
        finally:
            self._serving.join()

    def _closed(self) -> None:
        self.worker.shutdown(wait=True, cancel_futures=True)
        self.helper.close()

    def _summary(self, started_at: float) -> None:
        """The summary record last; then every id held is dropped."""
        self.result.stopped_by = self.stopped_by
        with self._lock:  # a request that ends from now on is counted in the summary, not recorded
            extra = self.summary_extra()
            self._summary_record = self.recorder.summary(SCENARIO, started_at, self.result.wall_s, extra)
        self.writer.close()
        if self.trace is not None:
            self.trace.close()
        self.conversations.clear()

    # -- start and stop from another thread -------------------------------------------------------

    def start(self) -> str:
        """Run the loop on a thread of its own, until ``stop``; the address clients connect to."""
        if not self._claim():
            raise RuntimeError("a tap runs once")
        threading.Thread(target=self._run_in_background, name="tap", daemon=True).start()
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError(f"the tap did not start: {self.stopped_by}") from self._failure
        return self.relay.address

    def end(self, why: str) -> None:
        """Ask the run to end, from another thread; ``run`` returns once the summary is written."""
        self.ending(why)
        self._stop.set()

    def stop(self, why: str = "the tap stopped") -> Record:
        """End the run (what is in flight is recorded as interrupted, the summary last) and wait for its summary
        record. A tap that never ran runs its loop here, which ends at once."""
        self.end(why)
        if self._claim():
            self._run_claimed()
        self._done.wait()
        if self._summary_record is None:
            raise RuntimeError("the tap's run failed before its summary") from self._failure
        return self._summary_record

    def summary_extra(self) -> Extra:
        t = self.tally
        return {
            "schedule": SCENARIO, "requests": t.requests, "users": self.conversations.started,
            "sleeps": self.tasks.sleeps() if self.tasks else 0, "stopped_by": self.result.stopped_by, "gaps": [],
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
        if path is None or self.tasks is None:
            return ["no --server-log: the records carry counts but no causes"]
        if not path.is_file():
            return [f"--server-log {path}: no such file yet; the causes need llama-server's -lv 4 log there"]
        kinds = self.tasks.kinds()  # what the task log read, not the whole file again: a busy -lv 4 log grows by GBs
        if self.tasks.read_error:  # the summary says so: a log that cannot be read does not stop the tap
            return [f"--server-log {path}: cannot be read ({self.tasks.read_error}); the causes need it"]
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

    def observe(self, path: str, body: bytes) -> Request:
        return Request(self, path, body)

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

    def keep(self, write: Callable[[], None]) -> None:
        """Write a request's record, unless the summary is written: a request that ends later is not recorded (the
        writer is closed), as the summary's ``unfinished_at_stop`` says."""
        with self._lock:
            if self._summary_record is None:
                write()

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
