"""The `reusebench` command: `main`, which parses the command line and runs the command it names."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence

from reusebench.capability import learned_memory
from reusebench.cli import common, parser
from reusebench.cli.exits import Exit
from reusebench.cli.parser import build_parser
from reusebench.config import asv_selection, corpus, profiles, workload
from reusebench.fuzz.case import CaseFileError
from reusebench.llama import binaries, process
from reusebench.nightly import NightlyError
from reusebench.report.site import SiteError
from reusebench.trace.mooncake import TraceError
from reusebench.trace.prompts import VocabularyError

__all__ = ["build_parser", "main"]

# a file the command reads is wrong (it names the file and field): apart from a wrong command line
CONFIG_ERRORS = (profiles.ProfileError, corpus.CorpusError, workload.WorkloadError, binaries.BinaryError,
                 asv_selection.SelectionError, NightlyError, SiteError, learned_memory.ModelLoadError, TraceError,
                 VocabularyError, CaseFileError)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser.parse(build_parser(), argv)
    if args.verbosity > 0:  # -v: the llama-server starts and stops that reusebench.llama logs
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logging.getLogger("reusebench").addHandler(handler)
        logging.getLogger("reusebench").setLevel(logging.DEBUG)
    previous = signal.signal(signal.SIGTERM, common.terminated)
    try:
        return int(args.func(args))
    except CONFIG_ERRORS as exc:  # a file named on the command line that is not there is a usage error
        print(f"reusebench {args.command}: {exc}", file=sys.stderr)
        return Exit.USAGE if getattr(exc, "not_there", False) else Exit.CONFIG
    except ValueError as exc:  # options that do not go together, a name that is not there
        print(f"reusebench {args.command}: {exc}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM where the command keeps nothing of its own (setup, a probe)
        return common.interrupted(lambda: f"reusebench {args.command}: interrupted; every server stopped")
    finally:
        process.stop_all()
        signal.signal(signal.SIGTERM, previous)
