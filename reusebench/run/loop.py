"""The run loop: one lifecycle for every driver that records calls.

A driver is a source of calls: a scenario session's steps (``run.session``), a workload's users
(``run.service``), a trace's requests (``run.replay``), real traffic through the tap (``tap.tap``). The loop owns
what they share: start the source, learn the build (the label and the probed rules every record carries), let the
driver send, release what was started on every way out, Ctrl-C included, and write the summary record last. A
driver that starts its launch's server runs on ``ServerLoop``, which also keeps the scrubbed server log and stops
the server (its process group); the tap relays to a server it did not start, and learns its build from the first
request. A driver says only how its calls arise (``_drive``) and what its summary holds (``_summary``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from reusebench.capability import Capabilities
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
    """The lifecycle of every run: ``run`` starts the driver's source (``_start``), lets it send (``_drive``),
    releases what it started on every way out, Ctrl-C included (``_release``), then writes the summary record last;
    it returns the result when the driver is done, or raises what stopped it."""

    result: RunResult

    def __init__(self, recorder: Recorder, *, session: str, out: TextIO = sys.stderr) -> None:
        self.recorder, self.out, self.session = recorder, out, session
        self._started = 0.0  # the driver's clock: reset by a driver whose measured part starts later

    def run(self) -> RunResult:
        started_at = time.time()
        self._started = time.monotonic()
        try:
            self._start()
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
                self._release()
            finally:
                try:
                    self._closed()
                finally:
                    self._summary(started_at)
        return self.result

    def learn(self, build_label: str, capabilities: Capabilities | None = None) -> None:
        """The build every later record carries, with its probed rules where known."""
        self.recorder.learn_build(build_label, capabilities)

    def _start(self) -> None:
        raise NotImplementedError

    def _drive(self) -> None:
        """Send the calls; return when they are done or the run stops."""
        raise NotImplementedError

    def _absorbed(self, exc: BaseException) -> bool:
        """Whether `exc` is a finding the result keeps (a session's failed step) rather than an error to raise."""
        return False

    def _stop_sending(self) -> None:
        """Ctrl-C or an error: end what is in flight (the loop releases the source in any case)."""

    def _release(self) -> None:
        """Stop what ``_start`` started, on every way out."""
        raise NotImplementedError

    def _closed(self) -> None:
        """After the release, before the summary: release what the driver kept (threads, clients)."""

    def _summary(self, started_at: float) -> None:
        raise NotImplementedError

    def say(self, text: str) -> None:
        print(f"[{self.session}] {text}", file=self.out, flush=True)


class ServerLoop(RunLoop):
    """The loop of a driver that starts its launch's server: it learns the server's build once started, and keeps
    the scrubbed server log and stops the server (its process group) on every way out."""

    def __init__(self, spec: LaunchSpec, server: Server, recorder: Recorder, *, session: str, log_name: str,
                 out: TextIO = sys.stderr) -> None:
        super().__init__(recorder, session=session, out=out)
        self.spec, self.server, self.log_name = spec, server, log_name

    def _start(self) -> None:
        self._start_server()
        self.learn(binaries.build_label(self.spec.variant.binary, self.server.client.props().get("build_info")),
                   self.spec.capabilities)

    def _start_server(self) -> None:
        self.server.start()

    def _release(self) -> None:
        try:
            self.recorder.keep_log(self.server.process.raw_log_path, self.log_name)
        finally:
            self.server.close()
