"""The serial run: the schedule's steps one at a time, each checked against the server's log.

A request is sent when the one before it has ended, so no other request is in flight at any launch, and the
order in which requests ended is the order they were sent. What the driver believes is checked against what
the server logged, and the run fails on a deviation, since the counts would then depend on timing again:

- the server launched the request's task while another task was still running;
- the server slept (``sleep-idle-seconds`` passed between two requests) anywhere but in an idle gap;
- the request's task never showed in the log, so nothing explains its count.

Think times and the health check's period are an order here, not waits (``schedule``); the time bound does not
apply, since the schedule's length is fixed by the file.
"""

from __future__ import annotations

import time
from dataclasses import replace

from reusebench.config.workload import SERIAL
from reusebench.run.service import schedule
from reusebench.run.service.base import ServiceRun
from reusebench.run.service.calls import Call, Calls, Request
from reusebench.run.service.schedule import Step, StepKind
from reusebench.run.service.texts import Conversation, Texts

PROGRESS_EVERY = 10  # requests between progress lines


class ScheduleDeviation(RuntimeError):
    """The server did not do what the serial schedule fixed; the message names the step."""


def check_alone(calls: Calls, call: Call, label: str, *, woke_planned: bool, sleep_idle_s: float | None) -> None:
    """That the server ran `call`'s task alone and did not sleep before it unless planned: else ScheduleDeviation."""
    task = call.task
    if task is None:
        raise ScheduleDeviation(f"{label}: the server's log shows no task for it, so nothing explains its count")
    running = calls.tasks.running_at_launch(task)
    if running:
        raise ScheduleDeviation(
            f"{label}: the server launched task {task.task} while task(s) {', '.join(map(str, running))} "
            "had not logged their release ('stop processing'): another client used the server, or this build "
            "logs a release otherwise; the schedule sends one request at a time")
    woke = bool(call.record.cause and call.record.cause.get("woke"))
    if woke and not woke_planned:
        raise ScheduleDeviation(
            f"{label}: the server slept before it, outside an idle gap (sleep-idle-seconds "
            f"{sleep_idle_s or 0:g} passed between two requests: a machine this slow "
            "needs a longer sleep-idle-seconds)")


class SerialRun(ServiceRun):
    schedule_name = SERIAL
    alone = True

    def _send_all(self, texts: Texts) -> None:
        every = schedule.serial_schedule(self.workload, self.users)
        steps = schedule.cut(every, self.workload.max_requests)
        total = schedule.requests_in(steps)
        if total < schedule.requests_in(every):
            self.result.stopped_by = f"request bound ({self.workload.max_requests})"
        self.say(f"serial schedule: {total} requests from {len(self.users)} users, one at a time")
        conversations = {u.name: Conversation(u, texts, self.seen) for u in self.users}
        model = self.spec.reuse_model()  # one request at a time in a fixed order: every count is predictable
        client = self.client()
        woke_planned = False  # the next request comes after an idle gap in which the server slept
        try:
            for step in steps:
                if step.is_gap:
                    woke_planned = self.sleep_gap()
                    if woke_planned:
                        model.sleep()
                    continue
                request, conversation = self._request(step, texts, conversations)
                request = replace(request, expected=model.complete(request.prompt, lora=request.lora))
                self.requests += 1
                call = self.calls.send(client, request)
                if call.completion is None:
                    self.result.stopped_by = f"a call failed ({request.label}): {call.record.error}"
                    return
                model.answered(call.completion.tokens)
                if conversation is not None:
                    conversation.answered(call.completion.tokens)
                self._check(call, request, woke_planned)
                woke_planned = False
                self._progress(total)
        finally:
            client.close()

    def _request(self, step: Step, texts: Texts,
                 conversations: dict[str, Conversation]) -> tuple[Request, Conversation | None]:
        if step.kind == StepKind.PROBE:
            check = self.workload.health_check
            assert check is not None
            return texts.probe(check.tokens, step.number, self.seen), None
        assert step.user is not None
        conversation = conversations[step.user.name]
        return conversation.request(step.number, self.result.sleeps), conversation

    def _check(self, call: Call, request: Request, woke_planned: bool) -> None:
        check_alone(self.calls, call, request.label, woke_planned=woke_planned, sleep_idle_s=self.spec.sleep_idle_s)

    def _progress(self, total: int) -> None:
        if self.requests % PROGRESS_EVERY and self.requests != total:
            return
        elapsed = time.monotonic() - self._started
        left = elapsed / self.requests * (total - self.requests)
        self.say(f"{self.requests}/{total} requests in {elapsed:.0f} s" + (f", about {left:.0f} s left" if left else ""))
