"""One running llama-server as `run`, `check` and tools/gpu_check.py use it: process, client and log.

``Server`` starts and stops a ``process.ServerProcess``, keeps one ``client.LlamaClient`` on its
current port (a restart gets a new port, so a new client), reads the ``-lv 4`` log by offset in whole
lines, and waits for ``--sleep-idle-seconds`` to put the server to sleep.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from reusebench.llama import logs
from reusebench.llama.client import LlamaClient
from reusebench.llama.log_tail import LogTail
from reusebench.llama.logs import Event
from reusebench.llama.process import ServerError, ServerProcess

# The server compares its idle time with the limit at least once a second (its task loop waits at most
# 1 s for a task: tools/server/server-queue.cpp, start_loop) and flags is_sleeping before it frees the model,
# so a server that sleeps shows it within ~1 s of the limit. The rest covers a CPU shared with other jobs,
# where a process can stall for seconds. What sleep does to the caches: docs/llama-server-reuse.md, "Sleep".
SLEEP_GRACE_S = 10.0
SLEEP_POLL_S = 0.25


@dataclass(frozen=True)
class SleepWait:
    """How a wait for sleep ended: asleep or not, after how long, asking /props how many times."""

    asleep: bool
    waited_s: float
    polls: int


class Server:
    """A llama-server process, a client to it and its log; ``start``, ``restart``, ``stop``, ``close``."""

    def __init__(self, process: ServerProcess, *, call_timeout_s: float) -> None:
        self.process = process
        self.launch_args = list(process.args)  # what it was made with; a start may add to them
        self.call_timeout_s = call_timeout_s  # any call that does not give its own deadline
        self._client: LlamaClient | None = None
        self._log = LogTail(process.raw_log_path)

    @classmethod
    def of(cls, binary: Path, args: Sequence[str], *, call_timeout_s: float,
           env: Mapping[str, str] | None = None) -> Server:
        """The one way a llama-server process is made: `binary` with `args` (the process adds host, port, key and
        log), not started."""
        return cls(ServerProcess(binary, args, env=env), call_timeout_s=call_timeout_s)

    @property
    def client(self) -> LlamaClient:
        if self._client is None:
            raise ServerError("server is not running")
        return self._client

    def start(self, extra_args: Sequence[str] = ()) -> Server:
        """Start with the arguments it was made with (a --slot-save-path directory survives restarts), plus
        `extra_args` (a later option wins over the same one before it)."""
        self.process.args = [*self.launch_args, *extra_args]
        self.process.start()
        self._client = LlamaClient(self.process.base_url, self.process.api_key, timeout_s=self.call_timeout_s)
        return self

    def stop(self) -> None:
        self._close_client()
        self.process.stop()

    def restart(self, extra_args: Sequence[str] = ()) -> None:
        """Stop, then ``start`` with `extra_args`; a new port."""
        self.stop()
        self.start(extra_args)

    def close(self) -> None:
        """Stop the server and delete its private raw log."""
        self._close_client()
        self.process.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # the log

    def mark(self) -> int:
        """An offset in the log, just after its last complete line: what comes later belongs to later calls."""
        return self._log.offset()

    def lines_since(self, mark: int) -> list[str]:
        """Raw log lines (they may carry prompt text: never keep them) written since `mark`, whole lines only."""
        return self._log.read_since(mark)

    def events_since(self, mark: int) -> list[Event]:
        return logs.parse_lines(self.lines_since(mark))

    # sleep

    def wait_until_asleep(self, idle_limit_s: float) -> SleepWait:
        """Stay idle until /props says is_sleeping, at most `idle_limit_s` + SLEEP_GRACE_S.

        Only /props is asked: it does not wake a sleeping server (GET /slots and /tokenize do).
        """
        started = time.monotonic()
        polls = 1
        while not self.client.props().get("is_sleeping"):
            if time.monotonic() - started > idle_limit_s + SLEEP_GRACE_S:
                return SleepWait(False, time.monotonic() - started, polls)
            time.sleep(SLEEP_POLL_S)
            polls += 1
        return SleepWait(True, time.monotonic() - started, polls)
