"""The harness's own bounds for the drivers that send calls: one frozen object, resolved once and passed down to
the session, the workloads and the replay; the fuzz and the tap take its defaults (nothing reads them from the
environment or keeps a value of its own)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunSettings:
    request_timeout_s: float = 600.0  # one call of a workload or a trace: its longest prefill on a slow machine
    # a finished call's wait for its task's lines in the server's log: alone on the server (serially) they were
    # written before the answer ended, so the wait only covers a loaded machine's delay in reading them; with
    # other calls in flight, a line not there by then is counted missing rather than holding the others back
    claim_alone_s: float = 30.0
    claim_overlapped_s: float = 5.0
    session_ctx_margin: int = 1024  # a slot's room beyond a session's longest prompt: question, edit, extension
    trace_ctx_margin: int = 256  # a slot's room beyond a trace's longest request and its answer

    def claim_wait_s(self, *, alone: bool) -> float:
        return self.claim_alone_s if alone else self.claim_overlapped_s


DEFAULT = RunSettings()
