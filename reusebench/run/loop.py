"""The run loop: one lifecycle for every driver that starts a server and sends it calls.

A driver is a source of calls: a scenario session's steps (``run.session``), a workload's users
(``run.service``), a trace's requests (``run.replay``). The loop owns what they share: start the launch's server,
learn its build (the label and the probed rules every record carries), let the driver send, keep the scrubbed
server log, stop the server (its process group) on every way out, Ctrl-C included, and write the summary record
last. A driver says only how its calls arise (``_drive``) and what its summary holds (``_summary``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from reusebench.llama import binaries
from reusebench.llama.client import LlamaClient, recorded_error
from reusebench.llama.process import ServerProcess
from reusebench.records import Record, interrupted
from reusebench.run.launch import LaunchSpec
from reusebench.run.recording import Recorder


class Server(Protocol):
    """What the loop starts and stops: a launch's server (``LaunchSpec.server``) or a session's, which also
    restarts (``session_server.SessionServer``)."""

    @property
    def process(self) -> ServerProcess: ...

    @property
    def client(self) -> LlamaClient: ...

    def start(self) -> object: ...

    def close(self) -> None: ...


@dataclass(kw_only=True)
class RunResult:
    """What every run returns: its records, its wall time and why it stopped."""

    records: list[Record] = field(default_factory=list)
    wall_s: float = 0.0
    stopped_by: str = "every call sent"


class RunLoop:
    """Runs one driver against one server: ``run`` returns its result when the driver is done, or raises what
    stopped it after the server is stopped and the summary written."""

    result: RunResult

    def __init__(self, spec: LaunchSpec, server: Server, recorder: Recorder, *, session: str, log_name: str,
                 out: TextIO = sys.stderr) -> None:
        self.spec, self.server, self.recorder, self.out = spec, server, recorder, out
        self.session, self.log_name = session, log_name
        self._started = 0.0  # the driver's clock: reset by a driver whose measured part starts later

    def run(self) -> RunResult:
        started_at = time.time()
        self._started = time.monotonic()
        try:
            self._start()
            self.recorder.learn_build(binaries.build_label(self.spec.variant.binary,
                                                           self.server.client.props().get("build_info")),
                                      self.spec.capabilities)
            self._drive()
        except BaseException as exc:
            # a record keeps no server's words (``recorded_error``)
            self.result.stopped_by = interrupted() if isinstance(exc, KeyboardInterrupt) else \
                f"failed: {recorded_error(exc)}"
            self._stop_sending()
            if not self._absorbed(exc):
                raise
        finally:
            self.result.wall_s = time.monotonic() - self._started
            try:
                self.recorder.keep_log(self.server.process.raw_log_path, self.log_name)
            finally:
                self.server.close()
                self._closed()
                self._summary(started_at)
        return self.result

    def _start(self) -> None:
        self.server.start()

    def _drive(self) -> None:
        """Send the calls; return when they are done or the run stops."""
        raise NotImplementedError

    def _absorbed(self, exc: BaseException) -> bool:
        """Whether `exc` is a finding the result keeps (a session's failed step) rather than an error to raise."""
        return False

    def _stop_sending(self) -> None:
        """Ctrl-C or an error: end what is in flight (the loop stops the server in any case)."""

    def _closed(self) -> None:
        """After the server is stopped, before the summary: release what the driver kept (threads, clients)."""

    def _summary(self, started_at: float) -> None:
        raise NotImplementedError

    def say(self, text: str) -> None:
        print(f"[{self.session}] {text}", file=self.out, flush=True)
