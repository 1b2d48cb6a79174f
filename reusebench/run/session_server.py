"""A session's server over its lifetime: the launch line, the slot-save directory, starts, stops and restarts,
and the seconds they take (server loads are not harness overhead)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from reusebench.config.profiles import Variant
from reusebench.llama.process import ServerError, ServerProcess
from reusebench.llama.server import Server
from reusebench.machine import host
from reusebench.machine.gpu import GpuSampler
from reusebench.run.recording import ctx_size, ctx_size_args

CALL_TIMEOUT_S = 300.0  # any other call (tokenize, props, templates); a slot save/restore gets a deadline


class SessionServer:
    """Starts, stops and restarts one variant's server (its own process group, on 127.0.0.1, stopped on every
    way out by ``close``); keeps the host state before each load for the first record after it."""

    def __init__(self, variant: Variant, size: int, sampler: GpuSampler) -> None:
        self.variant, self.sampler = variant, sampler
        self.ctx_size = ctx_size(variant, size)
        self.slot_dir: Path | None = None
        args = variant.server_args() + ctx_size_args(variant, size)
        if variant.option("slot-save-path") is None:
            # restore_disk needs one; a private directory keeps slot files out of results/
            self.slot_dir = Path(tempfile.mkdtemp(prefix="reusebench-slots-"))
            args += ["--slot-save-path", str(self.slot_dir)]
        self.handle = Server(ServerProcess(variant.binary.path, args), call_timeout_s=CALL_TIMEOUT_S)
        self.load_s = 0.0  # seconds spent starting and stopping servers
        self._host_before_load: dict[str, Any] | None = None

    @property
    def server(self) -> ServerProcess:
        return self.handle.server

    @property
    def save_dir(self) -> Path:
        """Where slot files go: the private directory, or the variant's --slot-save-path."""
        return self.slot_dir or Path(str(self.variant.option("slot-save-path")))

    def check_slot_dir(self) -> None:
        """A configured --slot-save-path must be a writable directory: say so before launch, not at the first save."""
        configured = self.variant.option("slot-save-path")
        if configured is None:
            return
        path = Path(str(configured))
        try:
            path.mkdir(parents=True, exist_ok=True)
            test_file = path / f".reusebench-write-test-{os.getpid()}"
            test_file.write_bytes(b"")
            test_file.unlink()
        except OSError as exc:
            raise ServerError(f"options.slot-save-path: {path} is not a writable directory "
                              f"({exc.strerror or exc}); nothing was started") from exc

    def start(self) -> None:
        # page-cache residency of the model means something only before the server maps it
        self._host_before_load = host.capture(self.variant.model).to_dict()
        started = time.monotonic()
        try:
            self.handle.start()
        finally:
            self.load_s += time.monotonic() - started
        self.sampler.pid = self.server.pid

    def stop(self) -> None:
        started = time.monotonic()
        self.handle.stop()
        self.load_s += time.monotonic() - started

    def restart(self, extra_args: tuple[str, ...] = ()) -> None:
        """Stop, then start with the launch line plus `extra_args` (the noise band's other ubatch)."""
        self.stop()
        self.server.args = [*self.handle.launch_args, *extra_args]
        self.start()

    def host_state(self) -> dict[str, Any]:
        """The host before the last load for the first call after it, else the host now."""
        state, self._host_before_load = self._host_before_load or host.capture().to_dict(), None
        return state

    def close(self) -> None:
        """Stop the server (its process group) and remove the private slot directory."""
        stopping = time.monotonic()
        self.handle.close()
        self.load_s += time.monotonic() - stopping
        if self.slot_dir is not None:
            shutil.rmtree(self.slot_dir, ignore_errors=True)
