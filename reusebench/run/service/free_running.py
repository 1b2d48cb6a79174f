"""The free-running run: one thread per user, think times and arrivals on the wall clock, the health check on
its period, so the server meets the real scramble of threads.

Its counts vary from run to run: which slot a turn lands in, what the RAM cache holds and what LRU evicts
follow the order in which threads reach the server, which the CPU's scheduling decides.

An idle gap comes after a turn: each user with more turns waits once it has finished that turn; when all of them
wait, no new request starts (the health check's neither), the running ones end, the server is let sleep, then
the users go on. Bounds: at most ``max_requests`` requests and ``max_seconds`` of wall time (no request starts
after either). A failed call ends the run: the server is gone or broken. On Ctrl-C the server is stopped (so
the streams end) and every thread is joined.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from reusebench.config import users
from reusebench.config.users import User
from reusebench.config.workload import DURING_PREFILL, FREE_RUNNING
from reusebench.llama.client import LlamaClient, recorded_error
from reusebench.run.service.base import ServiceRun
from reusebench.run.service.calls import Call, Request
from reusebench.run.service.texts import Conversation, Texts

PACE_S = 0.1  # how often the pacing loop looks at the gaps and the time bound


class FreeRunningRun(ServiceRun):
    schedule_name = FREE_RUNNING

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._open = threading.Event()  # cleared during an idle gap
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._in_flight: list[str] = []  # "user/turn" of the calls in flight
        self._at_gap = [0] * len(self.workload.idle_gaps_after_turn)  # users waiting at each gap
        self._gap_after = {turn: index for index, turn in enumerate(self.workload.idle_gaps_after_turn)}
        self._prefilling = {u.name: threading.Event() for u in self.users}  # set as the server starts its first prompt
        self._threads: list[threading.Thread] = []
        self._failure: Exception | None = None  # what ended a thread other than the run's end: raised by _send_all

    def _send_all(self, texts: Texts) -> None:
        w = self.workload
        self.say(f"free-running: {len(self.users)} users, {sum(u.turns for u in self.users)} turns planned; "
                 f"at most {w.max_requests} requests and {w.max_seconds:g} s")
        self._open.set()
        self._threads = [threading.Thread(target=self._user, args=(u, texts), name=u.name, daemon=True)
                         for u in self.users]
        if w.health_check is not None:
            self._threads.append(threading.Thread(target=self._health_check, args=(texts,), name="health",
                                                  daemon=True))
        for thread in self._threads:
            thread.start()
        self._pace(self._threads[: len(self.users)])
        self._stop.set()
        self._join()
        if self._failure is not None:
            raise self._failure

    def _stop_sending(self) -> None:
        self._stop.set()
        self.handle.stop()  # ends every stream at once; each thread records its call as interrupted
        self._join()

    def _join(self) -> None:
        for thread in self._threads:
            thread.join()

    # -- pacing and the idle gaps ---------------------------------------------------------------------

    def _pace(self, user_threads: list[threading.Thread]) -> None:
        """Hold each idle gap once every user due at it waits there; stop at the time bound; return when every
        user is done."""
        gaps = list(enumerate(self.workload.idle_gaps_after_turn))
        while any(t.is_alive() for t in user_threads):
            if time.monotonic() - self._started > self.workload.max_seconds:
                self._end(f"time bound ({self.workload.max_seconds:g} s)")
            if gaps and not self._stop.is_set():
                index, turn = gaps[0]
                with self._lock:
                    everyone = self._at_gap[index] == sum(u.turns > turn for u in self.users)
                if everyone:
                    gaps.pop(0)
                    self._idle_gap()
            time.sleep(PACE_S)

    def _idle_gap(self) -> None:
        with self._idle:
            self._open.clear()
            self._idle.wait_for(lambda: not self._in_flight)
        self.sleep_gap()  # the gap is over once it is in the result, which the users at it poll for
        with self._idle:
            self._idle.notify_all()
        self._open.set()

    def _wait_at_gap(self, index: int) -> bool:
        """Wait at idle gap `index` until it is over; False when the run stopped meanwhile."""
        with self._idle:
            self._at_gap[index] += 1
            while len(self.result.gaps) <= index:
                if self._stop.is_set():
                    return False
                self._idle.wait(timeout=PACE_S)
        return True

    def _admit(self, label: str) -> tuple[str, ...] | None:
        """Wait out an idle gap, then take one request from the budget: the calls already in flight; None when
        the run is over."""
        while not self._stop.is_set():
            if not self._open.wait(timeout=PACE_S):
                continue
            with self._lock:  # the gap closes under this lock too, so no request slips in after it
                if self._stop.is_set() or not self._open.is_set():
                    continue
                if self.requests >= self.workload.max_requests:
                    self._end(f"request bound ({self.workload.max_requests})")
                    return None
                self.requests += 1
                running = tuple(self._in_flight)
                self._in_flight.append(label)
                return running
        return None

    def _done(self, label: str) -> None:
        with self._idle:
            self._in_flight.remove(label)
            self._idle.notify_all()

    def _end(self, why: str) -> None:
        if not self._stop.is_set():
            self.result.stopped_by = why
        self._stop.set()

    def _wait(self, seconds: float) -> bool:
        """Think for `seconds`; False when the run stopped meanwhile."""
        return not self._stop.wait(seconds)

    # -- the users and the health check ------------------------------------------------------------------

    def _user(self, user: User, texts: Texts) -> None:
        client = self.client()
        try:
            self._talk(user, texts, client)
        except Exception as exc:
            self._fail(exc)
        finally:
            self._prefilling[user.name].set()  # the users after this one are not held back by it
            client.close()

    def _talk(self, user: User, texts: Texts, client: LlamaClient) -> None:
        if not self._arrive(user):
            return
        conversation = Conversation(user, texts, self.seen)
        for turn in range(1, user.turns + 1):
            gap = self._gap_after.get(turn - 1)
            if gap is not None and not self._wait_at_gap(gap):
                return
            if turn > 1 and not self._wait(user.think_s[turn - 2]):
                return
            running = self._admit(f"{user.name}/{turn}")
            if running is None:
                return
            request = conversation.request(turn, self.result.sleeps, running)
            call = self._send(client, request, self._prefilling[user.name].set)
            if call.completion is None:
                return
            conversation.answered(call.completion.tokens)

    def _arrive(self, user: User) -> bool:
        """Wait for the user's arrival: its time, or the start of the previous user's first prefill; False when the
        run stopped."""
        if self.workload.arrival != DURING_PREFILL or user.number == 0:
            return self._wait(user.arrival_s)
        before = self._prefilling[self.users[user.number - 1].name]
        while not before.wait(timeout=PACE_S):
            if self._stop.is_set():
                return False
        return True

    def _health_check(self, texts: Texts) -> None:
        check = self.workload.health_check
        assert check is not None
        client = self.client()
        try:
            number = 0
            while self._wait(check.period_s):
                running = self._admit(f"{users.HEALTH_CHECK}/{number + 1}")
                if running is None:
                    return
                number += 1
                if self._send(client, texts.probe(check.tokens, number, self.seen, running)).completion is None:
                    return
        except Exception as exc:
            self._fail(exc)
        finally:
            client.close()

    def _send(self, client: LlamaClient, request: Request, on_prefill: Callable[[], None] | None = None) -> Call:
        call = self.calls.send(client, request, interrupted=self._stop.is_set, on_prefill=on_prefill,
                               on_answered=lambda: self._done(request.label))
        if call.completion is None:
            self._end(f"a call failed ({request.label}): {call.record.error}")
        return call

    def _fail(self, exc: Exception) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = exc
        self._end(f"failed: {recorded_error(exc)}")  # a record keeps no server's words
