"""What both ways of running a workload share, on the run loop (``run.loop``): the users, the calls, the idle
gap's sleep, the summary record. ``SerialRun`` and ``FreeRunningRun`` differ in how they send the users' requests
(``_send_all``) and so in what they can check and bound.

The server is a profile variant started by ``Server`` (127.0.0.1, its own process group). Before the
first request every text is tokenized (``texts``). An idle gap lasts until ``/props`` says the server sleeps.
One record per call, written as it ends; on Ctrl-C or an error the server is stopped and every record written
is kept, the summary record last.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TextIO

from reusebench.capability.build import Build
from reusebench.config import users
from reusebench.config.profiles import Variant
from reusebench.config.users import User
from reusebench.config.workload import Workload
from reusebench.llama import task_log
from reusebench.llama.client import LlamaClient
from reusebench.llama.process import ServerProcess
from reusebench.records import RecordWriter
from reusebench.reuse import server_inputs
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.run import launch
from reusebench.run.launch import LaunchSpec
from reusebench.run.loop import RunResult, ServerLoop
from reusebench.run.recording import Recorder, RunDir, Source
from reusebench.run.service.calls import Calls
from reusebench.run.service.texts import Texts, make_texts
from reusebench.run.settings import DEFAULT, RunSettings

# Given the started server, a relay in front of it (the tap) for as long as the users talk: the URL they use.
Via = Callable[[ServerProcess], AbstractContextManager[str]]


@dataclass(kw_only=True)
class WorkloadResult(RunResult):
    stopped_by: str = "every user finished"
    sleeps: int = 0
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (began, ended) of each idle gap, epoch seconds


def system_tokens(workload: Workload) -> int:
    """The tokens every conversation (and the health check) opens with: BOS and the system prompt. The summary
    record keeps them (``system_prompt_tokens``), and a turn that reused no more is a miss (``records.outcome``)."""
    return workload.system_prompt_tokens + 1


def kv_tokens(workload: Workload, drawn: list[User], launch: server_inputs.Launch) -> int:
    """A KV pool for the launch's slots: shared (unified), it holds the longest conversations, one per slot, at their
    longest; split, every slot's share holds the longest one."""
    def longest(user: User) -> int:
        inserts = sum(kind == users.HEAD_INSERT for kind in user.kinds)
        return (system_tokens(workload) + user.opening_tokens + inserts * workload.summary_tokens
                + user.turns * (workload.question_tokens + workload.n_predict))
    ranked = sorted((longest(u) for u in drawn), reverse=True)
    return sum(ranked[:launch.n_slots]) if launch.kv_unified else ranked[0] * launch.n_slots


def resolve_for_workload(variant: Variant, server_build: Build, workload: Workload) -> LaunchSpec:
    """The launch of `variant` on its binary's `server_build` for `workload`: unless the variant sets --ctx-size,
    the KV pool holds its slots' longest conversations at their longest."""
    drawn = users.draw_users(workload)
    return launch.resolve(variant, server_build, context=lambda options: kv_tokens(workload, drawn, options))


class ServiceRun(ServerLoop):
    """One workload against one server variant, through the run loop; ``run`` returns when the users are done or
    a bound is hit."""

    schedule_name = ""  # how requests are ordered, as the summary record names it
    alone = False  # whether each call runs alone on the server (serially): how long it waits for its log lines

    def __init__(self, workload: Workload, spec: LaunchSpec, writer: RecordWriter, *, run: RunDir,
                 repeat: int | None = None, via: Via | None = None, settings: RunSettings = DEFAULT,
                 out: TextIO = sys.stderr) -> None:
        variant = spec.variant
        self.workload, self.variant, self.via, self.settings = workload, variant, via, settings
        self.users = users.draw_users(workload)
        self.handle = spec.server(call_timeout_s=settings.request_timeout_s)
        session = f"{workload.name}/{variant.profile}/{variant.name}"
        recorder = Recorder(writer, Source.of(variant), run=run, session=session,
                            size=max(u.opening_tokens for u in self.users),
                            extra=None if repeat is None else {"repeat": repeat}, shared=system_tokens(workload),
                            speculative=spec.launch.speculative)
        super().__init__(spec, self.handle, recorder, session=session, log_name=workload.name, out=out)
        self.result: WorkloadResult = WorkloadResult()
        self.seen = PerfectCache()  # every user's sequences: each turn's ideal
        self.calls = Calls(recorder, task_log.TaskLog(self.handle.process.raw_log_path), self.seen, workload.name,
                           n_predict=workload.n_predict, timeout_s=settings.request_timeout_s,
                           claim_wait_s=settings.claim_wait_s(alone=self.alone))
        self.clients_url = ""  # where the users send their requests: the server, or the relay in front of it
        self.requests = 0  # calls sent
        self._setup()

    def _setup(self) -> None:
        """What a way of sending keeps besides (threads, locks), made before anything can stop the run."""

    def _drive(self) -> None:
        texts = make_texts(self.handle.client, self.workload, self.users)
        with self._clients_url():
            self._started = time.monotonic()  # the workload's clock starts here
            self._send_all(texts)

    def _closed(self) -> None:
        self.result.records = list(self.calls.records)

    def _send_all(self, texts: Texts) -> None:
        """Send the users' requests; return when they are done or the run stops."""
        raise NotImplementedError

    @contextlib.contextmanager
    def _clients_url(self) -> Iterator[None]:
        with contextlib.nullcontext(self.handle.process.base_url) if self.via is None else self.via(
                self.handle.process) as url:
            self.clients_url = url
            yield

    def client(self) -> LlamaClient:
        return LlamaClient(self.clients_url, self.handle.process.api_key, timeout_s=self.settings.request_timeout_s)

    def sleep_gap(self) -> bool:
        """The idle gap with nothing in flight: wait until the server sleeps (when the variant lets it); True
        when it did."""
        began = time.time()
        asleep = False
        if self.spec.sleeps:
            waited = self.handle.wait_until_asleep(self.spec.sleep_idle_s or 0.0)
            asleep = waited.asleep
            if asleep:
                self.result.sleeps += 1
            self.say(f"idle gap: {'asleep' if asleep else 'still awake'} after {waited.waited_s:.1f} s")
        else:
            self.say("idle gap: the variant sets no sleep-idle-seconds, so the server cannot sleep")
        self.result.gaps.append((began, time.time()))
        return asleep

    def _summary(self, started_at: float) -> None:
        w = self.workload
        self.recorder.summary(w.name, started_at, self.result.wall_s, {
            "schedule": self.schedule_name, "sleeps": self.result.sleeps, "gaps": self.result.gaps,
            "stopped_by": self.result.stopped_by, "requests": self.requests, "users": len(self.users),
            "long_prefill_tokens": w.long_prefill_tokens, "system_prompt_tokens": system_tokens(w)})
