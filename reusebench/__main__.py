"""`python -m reusebench` and the `reusebench` command (``entry``).

Loading the program takes a second; Ctrl-C or SIGTERM then, before any server started, ends it as one later
does: exit 130, no traceback.
"""

import signal
import sys

INTERRUPTED = 130  # cli.exits.Exit.INTERRUPTED, not imported: that import is what takes the second


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def entry() -> int:
    signal.signal(signal.SIGTERM, _stop)
    try:
        from reusebench.cli import main
    except KeyboardInterrupt:
        print("\nreusebench: interrupted while loading; nothing was started", file=sys.stderr)
        return INTERRUPTED
    return main()


if __name__ == "__main__":
    raise SystemExit(entry())
