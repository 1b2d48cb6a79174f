"""Run a workload: its users talk to one llama-server at the same time, one thread each, streamed.

The server is a profile variant started by ``ServerHandle`` (127.0.0.1, its own
process group). Before the first request every text is tokenized (later
``/tokenize`` calls would wake a sleeping server), so each turn is sent as token
ids: the previous prompt, the tokens the server generated, the next question.
A health-check thread sends a short probe that shares the system prompt's opening.
An idle gap comes after a turn: each user with more turns waits once it has finished
that turn; when all of them wait, no new request starts (the health check's neither),
the running ones end, the driver waits until ``/props`` says the server sleeps, then
lets the users go on.

Bounds: at most ``max_requests`` requests and ``max_seconds`` of wall time (no
request starts after either), every request with a deadline. One record per call,
written as it ends; on Ctrl-C the server is stopped (so the streams end), every
thread is joined, and every record written is kept.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from reusebench.config import corpus, users
from reusebench.config.profiles import Variant
from reusebench.config.users import User
from reusebench.config.workload import Workload
from reusebench.llama import task_log
from reusebench.llama.client import ClientError, Completion, LlamaClient
from reusebench.llama.facts import NO_LORA
from reusebench.llama.handle import ServerHandle
from reusebench.llama.server import LlamaServer
from reusebench.records import Record, RecordWriter, Role, verdict
from reusebench.reuse.verification import common_prefix
from reusebench.run.recording import Recorder, ctx_size_args

CHARS_PER_TOKEN = 12  # generous for the corpus' words (one token per word): texts are cut to tokens after
REQUEST_TIMEOUT_S = 300.0


@dataclass
class Texts:
    """Token ids of everything the users say, made once with the server's tokenizer."""

    system: list[int]  # BOS + the shared system prompt
    openings: dict[str, list[int]]
    questions: dict[str, list[list[int]]]
    summary: list[int]
    probe_tail: list[int]


@dataclass
class DriverResult:
    records: list[Record] = field(default_factory=list)
    sleeps: int = 0
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (began, ended) of each idle gap, epoch seconds
    wall_s: float = 0.0
    stopped_by: str = "every user finished"


def kv_tokens(workload: Workload, drawn: list[User], slots: int) -> int:
    """A unified KV pool that holds the `slots` longest conversations at their longest."""
    def longest(user: User) -> int:
        inserts = sum(kind == users.HEAD_INSERT for kind in user.kinds)
        return (workload.system_prompt_tokens + 1 + user.opening_tokens + inserts * workload.summary_tokens
                + user.turns * (workload.question_tokens + workload.n_predict))
    return sum(sorted((longest(u) for u in drawn), reverse=True)[:slots])


def server_args(workload: Workload, variant: Variant, drawn: list[User]) -> list[str]:
    slots = int(variant.number("parallel") or 4)
    return variant.server_args() + ctx_size_args(variant, kv_tokens(workload, drawn, slots if slots > 0 else 4))


class ServiceDriver:
    """One workload against one server variant; ``run`` returns when the users are done or a bound is hit."""

    def __init__(self, workload: Workload, variant: Variant, writer: RecordWriter, *, run_id: str,
                 log_dir: Path, out: TextIO = sys.stderr) -> None:
        self.workload, self.variant, self.out = workload, variant, out
        self.users = users.draw_users(workload)
        self.handle = ServerHandle(LlamaServer(variant.binary.path, server_args(workload, variant, self.users)),
                                   call_timeout_s=REQUEST_TIMEOUT_S)
        self.tasks = task_log.TaskLog(self.handle.server.raw_log_path)
        self.result = DriverResult()
        self.session = f"{workload.name}/{variant.profile}/{variant.name}"
        self.recorder = Recorder(writer, variant, run_id=run_id, session=self.session, log_dir=log_dir,
                                 size=max(u.opening_tokens for u in self.users))
        self._lock = threading.Lock()
        self._open = threading.Event()  # cleared during an idle gap
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._sent = 0
        self._gap_after = {turn: index for index, turn in enumerate(workload.idle_gaps_after_turn)}
        self._at_gap = [0] * len(self._gap_after)  # users waiting at each gap
        self._sleeps = 0  # sleeps so far; a user whose count moved since its last turn sends an "after sleep" turn
        self._prefilling = {u.name: threading.Event() for u in self.users}  # set as the server starts its first prompt
        self._started = 0.0

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> DriverResult:
        started_at = time.time()
        self._started = time.monotonic()
        threads: list[threading.Thread] = []
        try:
            self.handle.start()
            self.recorder.learn_build(self.handle.client)
            texts = self._texts()
            self._say(f"{len(self.users)} users, {sum(u.turns for u in self.users)} turns planned; "
                      f"at most {self.workload.max_requests} requests and {self.workload.max_seconds:g} s")
            self._open.set()
            self._started = time.monotonic()  # the workload's clock (arrivals, idle gaps, the time bound) starts here
            threads += [threading.Thread(target=self._user, args=(u, texts), name=u.name, daemon=True)
                        for u in self.users]
            if self.workload.health_check is not None:
                threads.append(threading.Thread(target=self._health_check, args=(texts,), name="health",
                                                daemon=True))
            for thread in threads:
                thread.start()
            self._pace(threads[: len(self.users)])
            self._stop.set()
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:
            self.result.stopped_by = "interrupted (Ctrl-C)"
            self._stop.set()
            self.handle.stop()  # ends every stream at once; each thread records its call as interrupted
            for thread in threads:
                thread.join()
            raise
        finally:
            self.result.wall_s = time.monotonic() - self._started
            self.result.sleeps = self._sleeps
            self.recorder.keep_log(self.handle.server.raw_log_path, self.workload.name)
            self.handle.close()
            self._summary(started_at)
        return self.result

    def _pace(self, user_threads: list[threading.Thread]) -> None:
        """Hold each idle gap once every user due at it waits there; stop at the time bound; return when every
        user is done."""
        gaps = list(enumerate(self.workload.idle_gaps_after_turn))
        while any(t.is_alive() for t in user_threads):
            if time.monotonic() - self._started > self.workload.max_seconds:
                self.result.stopped_by = f"time bound ({self.workload.max_seconds:g} s)"
                self._stop.set()
            if gaps and not self._stop.is_set():
                index, turn = gaps[0]
                with self._lock:
                    everyone = self._at_gap[index] == sum(u.turns > turn for u in self.users)
                if everyone:
                    gaps.pop(0)
                    self._idle_gap()
            time.sleep(0.1)

    def _idle_gap(self) -> None:
        began = time.time()
        with self._idle:
            self._open.clear()
            self._idle.wait_for(lambda: self._in_flight == 0)
        limit = self.variant.number("sleep-idle-seconds") or -1
        if limit > 0:
            waited = self.handle.wait_until_asleep(limit)
            if waited.asleep:
                self._sleeps += 1
            self._say(f"idle gap: {'asleep' if waited.asleep else 'still awake'} after {waited.waited_s:.1f} s")
        else:
            self._say("idle gap: the variant sets no sleep-idle-seconds, so the server cannot sleep")
        with self._idle:  # a gap is over once it is in the result
            self.result.gaps.append((began, time.time()))
            self._idle.notify_all()
        self._open.set()

    def _wait_at_gap(self, index: int) -> bool:
        """Wait at idle gap `index` until it is over; False when the run stopped meanwhile."""
        with self._idle:
            self._at_gap[index] += 1
            while len(self.result.gaps) <= index:
                if self._stop.is_set():
                    return False
                self._idle.wait(timeout=0.1)
        return True

    def _admit(self) -> bool:
        """Wait out an idle gap, then take one request from the budget; False when the run is over."""
        while not self._stop.is_set():
            if not self._open.wait(timeout=0.1):
                continue
            with self._lock:  # the gap closes under this lock too, so no request slips in after it
                if self._stop.is_set() or not self._open.is_set():
                    continue
                if self._sent >= self.workload.max_requests:
                    self.result.stopped_by = f"request bound ({self.workload.max_requests})"
                    self._stop.set()
                    return False
                self._sent += 1
                self._in_flight += 1
                return True
        return False

    def _done(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def _wait(self, seconds: float) -> bool:
        """Think for `seconds`; False when the run stopped meanwhile."""
        return not self._stop.wait(seconds)

    # -- users --------------------------------------------------------------------------------

    def _user(self, user: User, texts: Texts) -> None:
        client = LlamaClient(self.handle.server.base_url, self.handle.server.api_key, timeout_s=REQUEST_TIMEOUT_S)
        try:
            if not self._arrive(user):
                return
            opening = texts.system + texts.openings[user.name]
            prompt, previous, seen_sleeps = opening, None, self._sleeps
            for turn, kind in enumerate(user.kinds, start=1):
                gap = self._gap_after.get(turn - 1)
                if gap is not None and not self._wait_at_gap(gap):
                    return
                if turn > 1 and not self._wait(user.think_s[turn - 2]):
                    return
                question = texts.questions[user.name][turn - 1]
                if turn > 1 and kind == users.HEAD_INSERT:
                    history = prompt[len(texts.system):] + previous.tokens
                    prompt = texts.system + texts.summary + history + question
                elif turn > 1 and kind == users.CONTINUES:
                    prompt = prompt + previous.tokens + question
                if not self._admit():
                    return
                if self._sleeps != seen_sleeps:
                    kind, seen_sleeps = users.AFTER_SLEEP, self._sleeps
                expected_hit = kind in users.SHOULD_HIT
                ideal = len(prompt) - (len(texts.system) if previous is None else
                                       max(len(texts.system), common_prefix(prompt, previous.sequence)))
                done = self._call(client, user.name, turn, kind, Role.MEASURE, prompt,
                                  user.request_lora, expected_hit=expected_hit, ideal=max(1, ideal))
                if done is None:
                    return
                previous = done
        finally:
            client.close()

    def _arrive(self, user: User) -> bool:
        """Wait for the user's arrival: its time, or the start of the previous user's first prefill; False when the
        run stopped."""
        if self.workload.arrival != "during_prefill" or user.number == 0:
            return self._wait(user.arrival_s)
        before = self._prefilling[self.users[user.number - 1].name]
        while not before.wait(timeout=0.1):
            if self._stop.is_set():
                return False
        return True

    def _health_check(self, texts: Texts) -> None:
        check = self.workload.health_check
        assert check is not None
        client = LlamaClient(self.handle.server.base_url, self.handle.server.api_key, timeout_s=REQUEST_TIMEOUT_S)
        shared = min(len(texts.system), check.tokens - 1)  # the probe's opening is the system prompt's
        probe = texts.system[:shared] + texts.probe_tail[: check.tokens - shared]
        try:
            number = 0
            while self._wait(check.period_s) and self._admit():
                number += 1
                if self._call(client, users.HEALTH_CHECK, number, users.HEALTH_CHECK, Role.PROBE, probe,
                              NO_LORA, expected_hit=False, ideal=len(probe) - shared) is None:
                    return
        finally:
            client.close()

    # -- one call -------------------------------------------------------------------------------

    def _call(self, client: LlamaClient, user: str, turn: int, kind: str, role: str, prompt: list[int],
              lora: list[dict[str, float]], *, expected_hit: bool, ideal: int) -> _Answer | None:
        started = time.time()
        record = self.recorder.record(self.workload.name, kind, role, "/completion", started, ended_at=started,
                                      user=user, turn=turn, expected_hit=expected_hit)
        Recorder.request(record, prompt, lora, ideal)
        prefilling = self._prefilling.get(user)

        def progress(processed: int, cached: int, total: int) -> None:
            if prefilling is not None:  # the server's first progress event comes before its first batch
                prefilling.set()

        try:
            completion = client.complete(prompt, n_predict=self.workload.n_predict, lora=lora, n_probs=0,
                                         timeout_s=REQUEST_TIMEOUT_S, on_progress=progress)
        except (ClientError, OSError) as exc:
            record.ended_at, record.status = time.time(), getattr(exc, "status", None)
            record.error = "interrupted (Ctrl-C)" if self._stop.is_set() else str(exc)
            self._write(record)
            self._done()
            self._stop.set()  # a failed call ends the run: the server is gone or broken
            return None
        finally:
            if prefilling is not None:
                prefilling.set()  # whatever happened, the users after this one are not held back by it
        self._done()
        self._fill(record, completion)
        self._write(record)
        return _Answer(completion.tokens, prompt + completion.tokens)

    def _fill(self, record: Record, c: Completion) -> None:
        Recorder.fill(record, c)
        task = self.tasks.claim(c.id_slot, record.prompt_tokens or 0) if c.id_slot is not None else None
        if task is not None:
            record.cause = task.cause().to_dict()
            record.extra |= {"task": task.task, "displaced": task.displaced, "idle_saved": task.idle_saved,
                             "evicted_mib": task.evicted_mib,
                             "checkpoints_erased_old": sum(e.kind == "checkpoint_erased_old" for e in task.events)}
        if record.role == Role.MEASURE:
            record.verdict = verdict(record)

    def _write(self, record: Record) -> None:
        with self._lock:
            self.recorder.write(record)
            self.result.records.append(record)

    # -- set-up and the end ------------------------------------------------------------------------

    def _texts(self) -> Texts:
        """Every token the users will send, from the corpus' words (one tokenizer call per text)."""
        spec = corpus.load_spec("tiny-words")
        client = self.handle.client

        def tokens(variant: int, n_tokens: int) -> list[int]:
            found = client.tokenize(corpus.source_text(spec, variant, n_tokens * CHARS_PER_TOKEN))[:n_tokens]
            if len(found) < n_tokens:
                raise ValueError(f"the corpus gave {len(found)} tokens where {n_tokens} were needed")
            return found

        w = self.workload
        bos = client.tokenize("", add_special=True)
        per_user = w.question_tokens * max(u.turns for u in self.users)
        return Texts(
            system=bos + tokens(1000, w.system_prompt_tokens),
            openings={u.name: tokens(2000 + u.number, u.opening_tokens) for u in self.users},
            questions={u.name: _chunks(tokens(3000 + u.number, per_user), w.question_tokens) for u in self.users},
            summary=tokens(4000, w.summary_tokens),
            probe_tail=tokens(5000, w.health_check.tokens if w.health_check else 1),
        )

    def _summary(self, started_at: float) -> None:
        self.recorder.summary(self.workload.name, started_at, self.result.wall_s, {
            "sleeps": self._sleeps, "gaps": self.result.gaps, "stopped_by": self.result.stopped_by,
            "requests": self._sent, "users": len(self.users), "long_prefill_tokens": self.workload.long_prefill_tokens,
            "system_prompt_tokens": self.workload.system_prompt_tokens + 1})

    def _say(self, text: str) -> None:
        print(f"[{self.session}] {text}", file=self.out, flush=True)


@dataclass(frozen=True)
class _Answer:
    tokens: list[int]  # what the server generated
    sequence: list[int]  # the prompt and the answer: what the slot holds after the turn


def _chunks(tokens: list[int], size: int) -> list[list[int]]:
    return [tokens[i: i + size] for i in range(0, len(tokens), size)]
