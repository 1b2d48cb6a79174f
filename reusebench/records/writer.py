"""The writer of a records file: one line per record, flushed at once, fsynced by a thread of its own."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TextIO

from reusebench.records.schema import Record


class RecordWriter:
    """Append-only JSONL file: every ``write`` is flushed to the OS before it returns, so a killed or
    interrupted run keeps every line; a background thread fsyncs right after (an fsync costs ~10 ms on some
    disks, which would otherwise add to every request), so at most the lines of the last moment can be
    lost to a power cut, and the reader skips a line cut short."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(self.path, "a", encoding="utf-8")
        self._dirty = threading.Event()
        self._closing = False
        self._syncer = threading.Thread(target=self._sync_loop, name="records-fsync", daemon=True)
        self._syncer.start()

    def write(self, record: Record) -> None:
        self._file.write(json.dumps(record.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")
        self._file.flush()
        self._dirty.set()

    def _sync_loop(self) -> None:
        fd = self._file.fileno()
        while True:
            self._dirty.wait()
            self._dirty.clear()
            if self._closing:
                return
            try:
                os.fsync(fd)
            except OSError:
                return

    def close(self) -> None:
        if self._file.closed:
            return
        self._closing = True
        self._dirty.set()
        self._syncer.join()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
