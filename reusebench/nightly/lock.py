"""One nightly per results directory at a time: an flock on DIR/nightly.lock, released by the kernel however the
holder ends."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "nightly.lock"


class NightlyBusy(RuntimeError):
    """Another nightly holds the lock on the same results directory."""


@contextmanager
def held(results: Path) -> Iterator[None]:
    """Hold the results directory's lock for the block, or raise NightlyBusy naming the holder's pid."""
    path = results / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise NightlyBusy(f"{path}: another nightly (pid {holder}) is running on {results}; this one did "
                              "nothing") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
