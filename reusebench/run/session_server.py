"""A session's server over its lifetime: the slot-save directory, starts, stops and restarts, and the seconds they
take (server loads are not harness overhead). What it launches is the session's ``LaunchSpec``."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from reusebench.llama.client import LlamaClient
from reusebench.llama.process import ServerError, ServerProcess
from reusebench.llama.server import SleepWait
from reusebench.machine import host
from reusebench.machine.gpu import GpuSampler
from reusebench.run.launch import LaunchSpec

CALL_TIMEOUT_S = 300.0  # any other call (tokenize, props, templates); a slot save/restore gets a deadline


class SessionServer:
    """Starts, stops and restarts one session's server (its own process group, on 127.0.0.1, stopped on every way
    out by ``close``); keeps the host state before each load for the first record after it."""

    def __init__(self, spec: LaunchSpec, sampler: GpuSampler) -> None:
        self.spec, self.sampler = spec, sampler
        # restore_disk needs a slot-save directory; a private one keeps slot files out of results/
        self.slot_dir = None if spec.slot_save_path else Path(tempfile.mkdtemp(prefix="reusebench-slots-"))
        private = () if self.slot_dir is None else ("--slot-save-path", str(self.slot_dir))
        self.server = spec.server(call_timeout_s=CALL_TIMEOUT_S, extra_args=private)
        self.load_s = 0.0  # seconds spent starting and stopping servers
        self._host_before_load: dict[str, Any] | None = None

    @property
    def process(self) -> ServerProcess:
        return self.server.process

    @property
    def client(self) -> LlamaClient:
        return self.server.client

    @property
    def save_dir(self) -> Path:
        """Where slot files go: the private directory, or the variant's --slot-save-path."""
        return self.slot_dir or Path(str(self.spec.slot_save_path))

    def wait_until_asleep(self) -> SleepWait:
        return self.server.wait_until_asleep(self.spec.sleep_idle_s or 0.0)

    def check_slot_dir(self) -> None:
        """A configured --slot-save-path must be a writable directory: say so before launch, not at the first save."""
        path = self.spec.slot_save_path
        if path is None:
            return
        try:
            path.mkdir(parents=True, exist_ok=True)
            test_file = path / f".reusebench-write-test-{os.getpid()}"
            test_file.write_bytes(b"")
            test_file.unlink()
        except OSError as exc:
            raise ServerError(f"options.slot-save-path: {path} is not a writable directory "
                              f"({exc.strerror or exc}); nothing was started") from exc

    def start(self, extra_args: tuple[str, ...] = ()) -> None:
        # page-cache residency of the model means something only before the server maps it
        self._host_before_load = host.capture(self.spec.variant.model).to_dict()
        started = time.monotonic()
        try:
            self.server.start(extra_args)
        finally:
            self.load_s += time.monotonic() - started
        self.sampler.pid = self.process.pid

    def stop(self) -> None:
        started = time.monotonic()
        self.server.stop()
        self.load_s += time.monotonic() - started

    def restart(self, extra_args: tuple[str, ...] = ()) -> None:
        """Stop, then start with the launch line plus `extra_args` (the noise band's other ubatch)."""
        self.stop()
        self.start(extra_args)

    def host_state(self) -> dict[str, Any]:
        """The host before the last load for the first call after it, else the host now."""
        state, self._host_before_load = self._host_before_load or host.capture().to_dict(), None
        return state

    def close(self) -> None:
        """Stop the server (its process group) and remove the private slot directory."""
        stopping = time.monotonic()
        self.server.close()
        self.load_s += time.monotonic() - stopping
        if self.slot_dir is not None:
            shutil.rmtree(self.slot_dir, ignore_errors=True)
