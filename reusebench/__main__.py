"""`python -m reusebench` and the `reusebench` command (``entry``).

Ctrl-C or SIGTERM at any moment ends the command with exit 130 and no traceback: while the program loads (before
any server started), while the command runs (the command's own handling), and as it ends, once the command has
returned or while Python shuts down (its work is whole then; the exit says it was interrupted all the same).
"""

import os
import signal
import sys

INTERRUPTED = 130  # cli.exits.Exit.INTERRUPTED, not imported: that import is what takes the second
_LATE_NOTE = b"\nreusebench: interrupted as it ended; every server stopped, what it wrote is whole\n"

_signalled = False  # a signal the command could not act on: it came as the command ended
_flushed = False  # the last exit handler ran: nothing is left to finish but Python's own teardown
_status: int | None = None  # what the command returned; the process ends with it, before Python's teardown


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _note(signum: int, frame: object) -> None:
    global _signalled
    _signalled = True
    if _flushed:
        os.write(2, _LATE_NOTE)
        os._exit(INTERRUPTED)


def _unraisable(info: "sys.UnraisableHookArgs") -> None:
    """A signal's KeyboardInterrupt raised inside a callback Python cannot raise from (a weakref's, a finalizer's):
    it is noted, not printed as a traceback."""
    global _signalled
    if isinstance(info.exc_value, KeyboardInterrupt):
        _signalled = True
        return
    sys.__unraisablehook__(info)


def _at_exit() -> None:
    """Registered first, so it runs after every other exit handler (servers stopped by then). Once the command
    returned, the process ends here: Python's teardown sets Ctrl-C and SIGTERM back to their defaults, and a
    signal then would kill it with no word said."""
    global _flushed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    _flushed = True
    if _signalled:
        os.write(2, _LATE_NOTE)
        os._exit(INTERRUPTED)
    if _status is not None:
        os._exit(_status)


def _note_from_now_on() -> None:
    signal.signal(signal.SIGINT, _note)
    signal.signal(signal.SIGTERM, _note)


def entry() -> int:
    global _signalled, _status
    import atexit

    atexit.register(_at_exit)
    sys.unraisablehook = _unraisable
    signal.signal(signal.SIGTERM, _stop)
    try:
        from reusebench.cli import main
    except KeyboardInterrupt:
        print("\nreusebench: interrupted while loading; nothing was started", file=sys.stderr)
        return INTERRUPTED
    try:
        try:
            status = main()
        finally:
            _note_from_now_on()
    except KeyboardInterrupt:  # in the command's last step (stopping its servers), past its own handling
        _note_from_now_on()
        _signalled = True
        status = INTERRUPTED
    _status = INTERRUPTED if _signalled else status
    return _status

if __name__ == "__main__":
    raise SystemExit(entry())
