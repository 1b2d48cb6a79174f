"""The `reusebench` command: `main`, which parses the command line and runs the command it names."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from reusebench.cli import common
from reusebench.cli.parser import build_parser
from reusebench.config import corpus, profiles, workload
from reusebench.llama import binaries, process

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, common.terminated)
    try:
        return int(args.func(args))
    except (profiles.ProfileError, corpus.CorpusError, workload.WorkloadError, binaries.BinaryError,
            ValueError) as exc:
        print(f"reusebench: {exc}", file=sys.stderr)
        return 2
    finally:
        process.stop_all()
        signal.signal(signal.SIGTERM, previous)
