"""Launch, watch and stop one llama-server process.

The server always binds 127.0.0.1 on a free port, runs in its own process group
with a random API key, and logs at ``-lv 4`` into a private file (checkpoint and
RAM-cache decisions are logged only at that level).
Every started server is registered so that an error, a timeout or Ctrl-C anywhere
still stops it, and on Linux the kernel sends it SIGTERM when the process that started
it dies without a word (SIGKILL, the OOM killer, asv ending a benchmark): nothing
outlives the run.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from reusebench.llama.binaries import death_by_signal
from reusebench.llama.logs import scrub_line

logger = logging.getLogger(__name__)  # `reusebench -v` shows it: each start and stop

HEALTH_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 20
BIND_ATTEMPTS = 3

_live: set[ServerProcess] = set()

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None  # looked up before fork


def _die_with_parent(parent: int) -> None:
    """In the server's child, before exec: SIGTERM when the starting thread's process dies. The kernel ties it to
    the thread that forked, so it is set only for servers the main thread starts (see ``_start_once``)."""
    assert _prctl is not None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # an ignored SIGTERM would stay ignored across exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died between the fork and the prctl
        os.kill(os.getpid(), signal.SIGTERM)


class ServerError(RuntimeError):
    """The server could not be started, died, or stopped answering.

    ``log_tail`` keeps the start-up log when the message is a one-line diagnosis.
    """

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_all() -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in list(_live):
        server.stop()


atexit.register(stop_all)


class ServerProcess:
    """One llama-server process: ``start()``, ``restart()``, ``stop()``.

    ``args`` are the profile's options (model, mmproj, LoRA, llama-server long
    options); this class adds only what the harness owns: host, port, API key and
    log verbosity. ``restart()`` reuses the same arguments, so a
    ``--slot-save-path`` directory survives it.
    """

    def __init__(
        self,
        binary: Path,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_verbosity: int = 4,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        port: int | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.args = list(args)
        self.env = dict(os.environ if env is None else env)
        self.log_verbosity = log_verbosity
        self.health_timeout_s = health_timeout_s
        self.requested_port = port
        self.api_key = secrets.token_hex(16)
        self.port: int | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self._private_dir = Path(tempfile.mkdtemp(prefix="reusebench-server-"))
        os.chmod(self._private_dir, 0o700)
        # Raw log at -lv 4 may carry prompt text; it stays private and is deleted on close(), or, for a server
        # never closed, when this object goes or the process exits (Ctrl-C, SIGTERM, an error anywhere).
        self.raw_log_path = self._private_dir / "server.log"
        weakref.finalize(self, shutil.rmtree, self._private_dir, ignore_errors=True)
        self.starts = 0
        self._start_offset = 0

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise ServerError("server is not running")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def argv(self) -> list[str]:
        if self.port is None:
            raise ServerError("no port chosen yet")
        return [
            str(self.binary),
            *self.args,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--api-key", self.api_key,
            "--log-verbosity", str(self.log_verbosity),
        ]

    def start(self) -> ServerProcess:
        """Start and wait until ``/health`` answers 200; raise ServerError with the log tail otherwise.

        A free port can be taken by someone else before the server binds it; with an
        automatically chosen port the start is retried on another one.
        """
        for attempt in range(BIND_ATTEMPTS):
            try:
                return self._start_once()
            except ServerError as exc:
                if self.requested_port is not None or "couldn't bind" not in str(exc) or attempt + 1 == BIND_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> ServerProcess:
        if self.popen is not None:
            raise ServerError("server already started")
        self._private_dir.mkdir(mode=0o700, exist_ok=True)  # again after a close()
        if not self.binary.is_file() or not os.access(self.binary, os.X_OK):
            raise ServerError(f"llama-server binary missing or not executable: {self.binary}")
        self.port = self.requested_port or free_port()
        self._start_offset = self.log_size()
        parent = os.getpid()
        tied = _prctl is not None and threading.current_thread() is threading.main_thread()
        with open(self.raw_log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # own process group: stop() kills it whole
                preexec_fn=(lambda: _die_with_parent(parent)) if tied else None,
            )
        _live.add(self)
        self.starts += 1
        logger.debug("started llama-server pid %d on 127.0.0.1:%d: %s %s", self.popen.pid, self.port, self.binary,
                  " ".join(self.args))  # the arguments the profile chose; never the API key
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.health_timeout_s
        with httpx.Client(base_url=self.base_url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                code = self.popen.poll() if self.popen else None
                if code is not None:
                    time.sleep(0.2)  # let the log writer of the exiting process finish its last lines
                    tail = self.startup_log_tail()
                    diagnosis = death_by_signal(code, self.binary)
                    if diagnosis:
                        raise ServerError(diagnosis, log_tail=tail)
                    raise ServerError(
                        f"llama-server exited with status {code} during start-up; last log lines:\n" + tail,
                        log_tail=tail,
                    )
                try:
                    if http.get("/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise ServerError(
            f"llama-server did not become healthy within {self.health_timeout_s:.0f} s; last log lines:\n"
            + self.startup_log_tail()
        )

    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def stop(self) -> int | None:
        """Terminate the whole process group, then kill it after a grace period. Idempotent."""
        process = self.popen
        if process is None:
            return None
        try:
            os.killpg(process.pid, signal.SIGTERM)
            os.killpg(process.pid, signal.SIGCONT)  # a stopped (hung) server must run to see SIGTERM
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # also reaps children that ignored SIGTERM
        except ProcessLookupError:
            pass
        process.wait()
        logger.debug("stopped llama-server pid %d (exit status %s)", process.pid, process.returncode)
        self.popen = None
        self.port = None
        _live.discard(self)
        return process.returncode

    def restart(self) -> ServerProcess:
        self.stop()
        return self.start()

    def kill_hard(self) -> None:
        """SIGKILL the group without waiting for a clean exit (fault-injection and timeouts)."""
        if self.popen is not None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_size(self) -> int:
        return self.raw_log_path.stat().st_size if self.raw_log_path.exists() else 0

    def startup_log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Last lines of the current start-up, unfiltered: no request has reached this process yet,
        so they cannot carry prompt text, and errors (bind, model load) are not in the allowlist."""
        with open(self.raw_log_path, "rb") as log:
            log.seek(self._start_offset)
            text = log.read().decode(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Last log lines, scrubbed of anything that could carry prompt text."""
        if not self.raw_log_path.exists():
            return ""
        text = self.raw_log_path.read_text(errors="replace").splitlines()
        kept = [s for s in (scrub_line(line) for line in text) if s]
        return "\n".join(kept[-lines:])

    def close(self) -> None:
        """Stop the server and delete the private raw log."""
        self.stop()
        shutil.rmtree(self._private_dir, ignore_errors=True)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
