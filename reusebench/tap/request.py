"""One request through the tap: what its body asks, classed beside the relay (its conversation, its ideal), its
answer read as it passes, and its record written once the client has the whole answer; nothing of its text."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import httpx

from reusebench.config import workload
from reusebench.llama.client import Completion
from reusebench.llama.task_log import Task, TaskLog
from reusebench.records import Extra, Record, Role, was_interrupted
from reusebench.run.recording import Recorder
from reusebench.tap import exchange
from reusebench.tap.conversations import Conversations, Ticket
from reusebench.tap.exchange import Answer, Asked
from reusebench.tap.trace import TraceWriter

SCENARIO = workload.TAPPED  # the records' scenario and the summary's schedule
AUTH_HEADERS = ("authorization", "x-api-key")


class RelayingTap(Protocol):
    """What a request needs of the tap that relays it (``tap.tap.Tap``)."""

    worker: ThreadPoolExecutor  # one thread: the calls for one conversation stay in order
    helper: httpx.Client  # the upstream's /tokenize and /apply-template
    conversations: Conversations
    recorder: Recorder
    tasks: TaskLog | None
    trace: TraceWriter | None
    claim_wait_s: float

    @property
    def stopped(self) -> bool: ...

    def learn_when_due(self, headers: dict[str, str]) -> None: ...

    def count(self, **added: float) -> None: ...

    def sleeps(self) -> int: ...

    def keep(self, write: Callable[[], None]) -> None: ...


class Request:
    """One recorded request in flight (``relay.Observed``): its prompt classed beside the relay, its answer read as
    it passes, its record written once the client has it."""

    def __init__(self, tap: RelayingTap, path: str, body: bytes) -> None:
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
            why = error or (answer.error if answer is not None else None) or "the answer ended without its timings"
            tap.keep(lambda: tap.recorder.cut_short(record, why, self.status))
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

        def write() -> None:
            tap.recorder.write(record)
            if tap.trace is not None and made is not None:
                tap.trace.write(self.started_at, made.ids, record.predicted_n or 0)
        tap.keep(write)

    def _claim(self, record: Record) -> Task | None:
        """The answer's task in the server's log, when the tap reads one (``--server-log``)."""
        tap = self.tap
        if tap.tasks is None or record.prompt_n is None:
            return None
        task = tap.tasks.claim(record.slot, record.prompt_n + (record.cache_n or 0), wait_s=tap.claim_wait_s)
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
