"""Why a call failed, as far as the harness can tell, and how long a call may take before the server counts as hung.

A call that timed out means a hung server: its process group is killed (no grace, it would not answer SIGTERM
either). A server that is gone gives its exit status and a scrubbed log tail. A failed slot save says whether
the disk was full, and leaves no half-written slot file behind.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from reusebench.llama import task_log
from reusebench.llama.client import ClientError
from reusebench.records import Record
from reusebench.run.recording import Recorder
from reusebench.run.session_server import SessionServer

# Deadline of one completion: max(HANG_FLOOR_S, HANG_FACTOR x prompt tokens / prefill rate + HANG_MARGIN_S
# + HANG_PER_TOKEN_S x n_predict), counted from its last progress (``LlamaClient._stream``): a call slowed more
# than HANG_FACTOR times by a machine that got busy still ends.
# The rate is the first load's; before it is measured, UNMEASURED_RATE (tokens/s) stands in: report A's
# slowest 128K first load ran at ~90 tokens/s, so 100 gives a 128K first load ~87 minutes.
HANG_FLOOR_S = 60.0
HANG_FACTOR = 4.0
HANG_MARGIN_S = 30.0
UNMEASURED_RATE = 100.0
HANG_PER_TOKEN_S = 1.0  # per generated token
LOG_TAIL_LINES = 12  # scrubbed server log lines kept on a failed record


def deadline_s(n_tokens: int, rate: float | None, n_predict: int) -> float:
    """Seconds one call on ``n_tokens`` prompt tokens may take before the server counts as hung."""
    return max(HANG_FLOOR_S, HANG_FACTOR * n_tokens / (rate or UNMEASURED_RATE) + HANG_MARGIN_S
               + HANG_PER_TOKEN_S * n_predict)


class Diagnosis:
    """Completes a failed call's record with what the server says about the failure, and writes it."""

    def __init__(self, server: SessionServer, recorder: Recorder, claim_wait_s: float) -> None:
        self.server, self.recorder = server, recorder
        self.claim_wait_s = claim_wait_s  # how long an answered call waits for its task's release in the log
        self.tasks = task_log.TaskLog(server.process.raw_log_path)

    def claim(self, slot: int | None, n_tokens: int, *, wait_s: float | None = None, released: bool = True
              ) -> task_log.Task | None:
        """The server's task for a completion of `n_tokens` on `slot` (``TaskLog.claim``, as the workload and the tap
        match theirs)."""
        return self.tasks.claim(slot, n_tokens, self.claim_wait_s if wait_s is None else wait_s, released=released)

    def fail(self, record: Record, exc: ClientError, why: str = "") -> ClientError:
        """Record a failed call with what the server says about it; the error to raise."""
        server = self.server.process
        record.ended_at = time.time()
        record.wall_ms = (record.ended_at - record.started_at) * 1000.0
        more = f" ({why})" if why else ""
        if "timed out" in str(exc) and server.is_running():
            server.kill_hard()
            record.extra["hung"] = True
            more += "; the server hung: its process group was killed"
        code = self.exit_status(2.0 if exc.status is None else 0.0)  # no HTTP answer: the server may be dying
        if code is not None:
            record.extra["exit_status"] = code
            more += f"; llama-server exited with status {code}"
        record.extra["log_tail"] = server.log_tail(LOG_TAIL_LINES)
        record.status, record.error = exc.status, exc.recorded + more  # the server's words stay out of records
        self.recorder.write(record)
        return ClientError(str(exc) + more, exc.status, recorded=record.error)

    def exit_status(self, wait_s: float = 2.0) -> int | None:
        """The server's exit status, waiting briefly for a process that is dying (a dropped connection comes first)."""
        process = self.server.process.popen
        if process is None:
            return None
        try:
            return process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:  # still running
            return None

    def save_failure(self, filename: str) -> str:
        """Why a slot save failed: a full disk or not, and no half-written file kept."""
        directory = self.server.save_dir
        partial = directory / filename
        try:
            free = shutil.disk_usage(directory).free
        except OSError as exc:
            return f"slot-save directory {directory}: {exc.strerror}"
        kept = partial.stat().st_size if partial.is_file() else 0
        state = "disk full" if free < (1 << 20) else "not a full disk"
        why = f"slot-save directory {directory}: {free:,} bytes free ({state})"
        if kept:
            partial.unlink()  # a truncated slot file would only fail a later restore
            why += f"; removed the partial slot file of {kept:,} bytes"
        return why
