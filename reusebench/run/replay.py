"""A trace replayed against one server variant: every request sent, measured and recorded beside its ideal (the
trace's own unbounded prefix cache) and its expected count (the reuse model's, ``trace.predict``).

Two ways to send:

- serial: one request at a time in trace order. Nothing depends on timing, so every measured count must equal
  the expected one; the run fails, as a serial workload does, if the server ran another task beside it.
- timed: each request at its arrival time (divided by ``speed``), as many in flight as the trace has. The
  expected count is still the serial prediction: how far it holds under overlap is the finding.

Each call goes through the workload's call lifecycle (``run.service.calls``): sent, timed, matched to its task in
the server's log, written at once. A request longer than a slot's context is not sent, and counted. On Ctrl-C or an
error the server is stopped and every record written is kept, the summary record last.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TextIO

from reusebench.capability.build import Build
from reusebench.config.profiles import Variant
from reusebench.llama import task_log
from reusebench.llama.client import LlamaClient
from reusebench.llama.memory_log import ModelMemory
from reusebench.records import Extra, RecordWriter, Role, RunKind
from reusebench.reuse.expectation import Expected
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.run import launch
from reusebench.run.launch import LaunchSpec
from reusebench.run.loop import RunResult, ServerLoop
from reusebench.run.recording import Recorder, RunDir, Source
from reusebench.run.service.calls import Call, Calls, Request
from reusebench.run.service.serial import ScheduleDeviation, check_alone
from reusebench.run.settings import DEFAULT, RunSettings
from reusebench.trace.mooncake import Trace
from reusebench.trace.predict import Prediction, fits, predict
from reusebench.trace.prompts import BlockIds, TracePrompt

SCENARIO = RunKind.REPLAY.value  # the scenario its records name
MAX_IN_FLIGHT = 64  # timed mode: threads sending at once, whatever the trace's overlap
PROGRESS_EVERY = 25



def resolve_for_trace(variant: Variant, build: Build, trace: Trace, *, memory: ModelMemory | None = None,
                      settings: RunSettings = DEFAULT) -> LaunchSpec:
    """The launch of `variant` on its binary's `build` for `trace`: unless the variant sets --ctx-size, every slot
    holds the trace's longest request and answer."""
    return launch.resolve(variant, build, memory=memory,
                          context=lambda options: (trace.longest + settings.trace_ctx_margin) * options.n_slots)


@dataclass(frozen=True)
class ReplayMode:
    timed: bool = False
    speed: float = 1.0  # timed: arrival times divided by this

    @property
    def name(self) -> str:
        return f"timed at {self.speed:g}x" if self.timed else "serial"


@dataclass(kw_only=True)
class ReplayResult(RunResult):
    prediction: Prediction | None = None
    skipped_too_long: int = 0


class Replay(ServerLoop):
    """One trace against one launch, through the run loop; ``run`` returns when every request is sent or the run
    stops."""

    def __init__(self, prompts: list[TracePrompt], blocks: BlockIds, spec: LaunchSpec, writer: RecordWriter, *,
                 run: RunDir, trace_name: str, mode: ReplayMode, settings: RunSettings = DEFAULT,
                 out: TextIO = sys.stderr) -> None:
        self.prompts, self.blocks, self.mode, self.settings = prompts, blocks, mode, settings
        variant = spec.variant
        self.handle = spec.server(call_timeout_s=settings.request_timeout_s)
        session = f"{SCENARIO}/{trace_name}/{variant.profile}/{variant.name}"
        recorder = Recorder(writer, Source.of(variant), run=run, session=session,
                            size=max((p.request.input_length for p in prompts), default=0),
                            extra=Extra(trace=trace_name, mode=mode.name), speculative=spec.launch.speculative)
        super().__init__(spec, self.handle, recorder, session=session, log_name=SCENARIO, out=out)
        self.calls = Calls(recorder, task_log.TaskLog(self.handle.process.raw_log_path), PerfectCache(),
                           SCENARIO, n_predict=1, timeout_s=settings.request_timeout_s,
                           claim_wait_s=settings.claim_wait_s(alone=not mode.timed))
        self.result: ReplayResult = ReplayResult()
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None  # timed: the threads sending, and their clients
        self._clients: list[LlamaClient] = []
        model_ctx = spec.launch.slot_ctx
        self.result.prediction = predict(prompts, spec.reuse_model(), blocks, model_ctx)
        self.sent = [p for p in prompts if fits(p, model_ctx)]
        self.result.skipped_too_long = len(prompts) - len(self.sent)

    def _drive(self) -> None:
        if self.result.skipped_too_long:
            self.say(f"{self.result.skipped_too_long} request(s) longer than a slot's {self.spec.launch.slot_ctx:,} "
                     "tokens: not sent")
        assert self.result.prediction is not None
        expected = {p.index: e for p, e in zip(self.prompts, self.result.prediction.expected, strict=True)}
        self._started = time.monotonic()
        self.say(f"{len(self.sent)} requests, {self.mode.name}")
        requests = [self._request(p, expected[p.index]) for p in self.sent]
        if self.mode.timed:
            self._timed(self.sent, requests)
        else:
            self._serial(requests)

    def _stop_sending(self) -> None:
        self._stop.set()

    def _closed(self) -> None:
        if self._pool is not None:  # in flight when it stopped: they end now the server is gone
            self._pool.shutdown(wait=True)
        for client in self._clients:
            client.close()
        self.result.records = list(self.calls.records)

    def _request(self, p: TracePrompt, expected: Expected | None) -> Request:
        return Request(user="trace", turn=p.index + 1, kind=f"line {p.request.line}", role=Role.MEASURE,
                       prompt=self.blocks.tokens(p.prompt), lora=None, expected_hit=p.ideal < p.request.input_length,
                       ideal=p.ideal, n_predict=p.n_predict, forced_token=self.blocks.vocabulary.answer,
                       expected=expected, line=p.request.line,
                       arrival_ms=p.request.timestamp_ms)

    def _client(self) -> LlamaClient:
        return LlamaClient(self.handle.process.base_url, self.handle.process.api_key,
                           timeout_s=self.settings.request_timeout_s)

    def _send(self, client: LlamaClient, request: Request) -> Call | None:
        if self._stop.is_set():
            return None  # the run stopped before its time came: not sent
        return self.calls.send(client, request, interrupted=self._stop.is_set)

    def _serial(self, requests: list[Request]) -> None:
        client = self._client()
        try:
            for n, request in enumerate(requests, 1):
                call = self._send(client, request)
                if call is None:
                    return
                if call.completion is None:
                    self.result.stopped_by = f"a call failed ({request.kind}): {call.record.error}"
                    return
                check_alone(self.calls, call, request.kind, woke_planned=False, sleep_idle_s=self.spec.sleep_idle_s)
                self._progress(n, len(requests))
        finally:
            client.close()

    def _timed(self, sent: list[TracePrompt], requests: list[Request]) -> None:
        first = sent[0].request.timestamp_ms if sent else 0
        local = threading.local()
        clients = self._clients

        def send(request: Request) -> Call | None:
            if not hasattr(local, "client"):
                local.client = self._client()
                clients.append(local.client)
            return self._send(local.client, request)

        futures: list[Future[Call | None]] = []
        pool = self._pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="replay")
        try:
            for p, request in zip(sent, requests, strict=True):
                due = self._started + (p.request.timestamp_ms - first) / 1000 / self.mode.speed
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    break
                futures.append(pool.submit(send, request))
            for n, future in enumerate(futures, 1):
                future.result()
                self._progress(n, len(requests))
        except BaseException:
            # Ctrl-C or an error: what is queued is not sent; what is in flight ends when ``run`` stops the server
            self._stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    def _progress(self, done: int, total: int) -> None:
        if done % PROGRESS_EVERY and done != total:
            return
        elapsed = time.monotonic() - self._started
        self.say(f"{done}/{total} requests in {elapsed:.0f} s")

    def _summary(self, started_at: float) -> None:
        prediction = self.result.prediction
        self.recorder.summary(SCENARIO, started_at, self.result.wall_s, {
            "mode": self.mode.name, "stopped_by": self.result.stopped_by, "requests": len(self.sent),
            "skipped_too_long": self.result.skipped_too_long, "block_tokens": self.blocks.block_tokens,
            "slot_context": self.spec.launch.slot_ctx, "ram_cache": self.spec.launch.cache_ram_mib != 0,
            "ideal": prediction.ideal if prediction else None,
            "expected": prediction.reprocessed if prediction else None,
            "expected_by_class": {k.value: v for k, v in prediction.excess_by_class.items()} if prediction else {}})


__all__ = ["Replay", "ReplayMode", "ReplayResult", "ScheduleDeviation", "resolve_for_trace"]
