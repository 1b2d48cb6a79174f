"""One call of a workload and its record: sent, timed, matched to its task in the server's log, written.

Both ways of running a workload send their requests through ``Calls``, so a record means the same in either.
A call that fails, or that Ctrl-C interrupts, is recorded as such before the error goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reusebench import records
from reusebench.llama import task_log
from reusebench.llama.client import ClientError, Completion, LlamaClient, recorded_error
from reusebench.llama.task_log import Task
from reusebench.records import Lora, Record, Role
from reusebench.reuse.expectation import Expected
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.run.recording import Recorder

FORCED_BIAS = 100.0  # logit_bias on a forced answer token: far above any logit a model gives


@dataclass(frozen=True)
class Request:
    """What one call sends and what the records say about it."""

    user: str
    turn: int  # the user's turn, or the probe's number
    kind: str  # users.FIRST, ..., users.HEALTH_CHECK
    role: Role
    prompt: list[int]
    lora: Lora
    expected_hit: bool
    ideal: int
    in_flight: tuple[str, ...] = ()  # "user/turn" of the driver's other calls in flight as this one is sent
    n_predict: int | None = None  # the answer's length; None: the run's
    forced_token: int | None = None  # every answer token is this one (a replayed trace's, ``trace.prompts``)
    expected: Expected | None = None  # what the reuse model predicts, where the driver has a model of the server
    line: int | None = None  # a replayed trace's line for it, and its arrival time there
    arrival_ms: int | None = None

    @property
    def label(self) -> str:
        return f"{self.user}/{self.turn}"


@dataclass(frozen=True)
class Call:
    record: Record
    completion: Completion | None  # None: the call failed (record.error says why)
    task: Task | None  # the server's task for it, from the log; None when the log never showed it


class Calls:
    """Sends calls for one workload run and writes each one's record; thread-safe."""

    def __init__(self, recorder: Recorder, tasks: task_log.TaskLog, seen: PerfectCache, scenario: str, *,
                 n_predict: int, timeout_s: float, claim_wait_s: float) -> None:
        self.recorder, self.tasks, self.seen, self.scenario = recorder, tasks, seen, scenario
        self.n_predict, self.timeout_s, self.claim_wait_s = n_predict, timeout_s, claim_wait_s
        self.records: list[Record] = []
        self._lock = threading.Lock()

    def send(self, client: LlamaClient, request: Request, *, interrupted: Callable[[], bool] = lambda: False,
             on_prefill: Callable[[], None] | None = None, on_answered: Callable[[], None] | None = None) -> Call:
        """Send `request` and record it. `on_prefill` runs once the server starts its prompt (its first progress
        event) or the call ends; `on_answered` as the call ends, before its log lines are looked up;
        `interrupted` says whether a failure is the run being stopped."""
        record = self.recorder.open(self.scenario, request.kind, request.role, "/completion", tokens=request.prompt,
                                    lora=request.lora, ideal=request.ideal, user=request.user, turn=request.turn,
                                    expected_hit=request.expected_hit)
        record.extra["in_flight"] = list(request.in_flight)
        if request.line is not None:
            record.extra["line"] = request.line
        if request.arrival_ms is not None:
            record.extra["arrival_ms"] = request.arrival_ms
        if request.expected is not None:
            record.expected, record.cause_expected = request.expected.prompt_n, request.expected.cause
        extra: dict[str, Any] = {"ignore_eos": True}
        if request.forced_token is not None:
            extra["logit_bias"] = [[request.forced_token, FORCED_BIAS]]
        prefilling = threading.Event()

        def progress(processed: int, cached: int, total: int) -> None:
            if on_prefill is not None and not prefilling.is_set():  # the first event comes before the first batch
                prefilling.set()
                on_prefill()

        try:
            # ignore_eos: every answer is n_predict tokens, so the next prompt's length is the workload's
            completion = client.complete(request.prompt, n_predict=request.n_predict or self.n_predict,
                                         lora=request.lora, n_probs=0, timeout_s=self.timeout_s, on_progress=progress,
                                         extra=extra)
        except (ClientError, OSError) as exc:
            self._cut_short(record, records.interrupted() if interrupted() else recorded_error(exc),
                            getattr(exc, "status", None))
            return Call(record, None, None)
        except BaseException as exc:  # Ctrl-C, or a fault of ours: the call is kept, then the error goes on
            self._cut_short(record, records.interrupted() if isinstance(exc, KeyboardInterrupt) or interrupted()
                            else f"{type(exc).__name__}: {exc}")
            raise
        finally:
            progress(0, 0, 0)  # whatever happened, whoever waits for this prefill is not held back by it
            if on_answered is not None:
                on_answered()
        self.seen.add([*request.prompt, *completion.tokens])
        if request.forced_token is not None:  # else the slot holds another answer than the model was told
            record.extra["answer_forced"] = all(t == request.forced_token for t in completion.tokens)
        task = None
        try:
            task = self.recorder.answered(record, completion, self._claim)
        finally:
            self._write(record)  # also when Ctrl-C comes while its log lines are looked up: what was measured stays
        return Call(record, completion, task)

    def _claim(self, record: Record) -> Task | None:
        if record.slot is None:
            return None
        return self.tasks.claim(record.slot, record.prompt_tokens or 0, wait_s=self.claim_wait_s)

    def _cut_short(self, record: Record, error: str, status: int | None = None) -> None:
        with self._lock:
            self.recorder.cut_short(record, error, status)
            self.records.append(record)

    def _write(self, record: Record) -> None:
        with self._lock:
            self.recorder.write(record)
            self.records.append(record)
