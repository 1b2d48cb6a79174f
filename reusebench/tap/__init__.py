"""The suite on real traffic: a relay in front of a running llama-server that records one text-free record per
request, in the suite's schema, for the service report.

- ``relay``: the HTTP pass-through (bytes unchanged, streaming, disconnects, credentials);
- ``exchange``: what a request's body asks and its answer says, and the prompt's ids the server's own way;
- ``conversations``: which conversation a request continues and how (its class), its ideal and divergence point;
- ``keys``: the keyed hashes the records hold instead of ids;
- ``naming``: how what is not recorded is named (a fixed route, the upstream without credentials);
- ``request``: one request's life through the tap, up to its record;
- ``tap``: the driver on the run loop that ties them to the recording core and the server's log.

``InFront`` puts a tap in front of a server the suite started itself (``reusebench workload --through-tap``),
so the tap's records can be held against the workload's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from reusebench.llama.process import ServerProcess
from reusebench.tap.keys import default_key_path
from reusebench.tap.tap import Tap, TapOptions

__all__ = ["InFront", "Tap", "TapOptions"]


class InFront:
    """A ``run.service.Via``: a tap on a free loopback port before each server the workload starts, reading its log;
    each tap's records go to a run of their own under `results` (``runs``), and its requests to `trace` when given
    (one server: the file is new)."""

    def __init__(self, results: Path, *, long_prefill_tokens: int, key_file: Path | None = None,
                 trace: Path | None = None) -> None:
        self.results, self.long_prefill_tokens, self.trace = results, long_prefill_tokens, trace
        self.key_file = key_file or default_key_path()
        self.runs: list[Path] = []

    @contextlib.contextmanager
    def __call__(self, server: ServerProcess) -> Iterator[str]:
        tap = Tap(TapOptions(upstream=server.base_url, listen=("127.0.0.1", 0), results=self.results,
                             key_file=self.key_file, server_log=server.raw_log_path,
                             long_prefill_tokens=self.long_prefill_tokens, trace=self.trace))
        self.runs.append(tap.run_dir.path)
        url = tap.start()
        try:
            yield url
        finally:
            tap.stop("the workload ended")
