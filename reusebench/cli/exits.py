"""The exit statuses of every command, in one table: `--help` prints it and docs/commands.md lists it."""

from __future__ import annotations

import textwrap
from enum import IntEnum


class Exit(IntEnum):
    """What a command's exit status says, as asv's and pytest's do: 0 clean, 1 a finding, 2 usage."""

    OK = 0
    FINDING = 1
    USAGE = 2
    CONFIG = 3
    BUSY = 4
    INTERRUPTED = 130


MEANING = {
    Exit.OK: "done; nothing failed (with check --strict: every option ACTIVE or UNVERIFIED)",
    Exit.FINDING: "done, and it found a failure: a session or workload failed, a check verdict failed (UNSAFE or "
                  "UNSUPPORTED; with --strict also DISABLED or INEFFECTIVE), compare found a regression, bisect found "
                  "a changed figure, a build or a nightly benchmark failed",
    Exit.USAGE: "the command line is wrong (argparse's usage error), or what it names is not there",
    Exit.CONFIG: "a file it reads is wrong: a profile, corpus, workload, asv config, llama-server binary or a "
                 "REUSEBENCH_ASV_* variable; the message names the file and field",
    Exit.BUSY: "another nightly holds the lock on the same results directory",
    Exit.INTERRUPTED: "Ctrl-C or SIGTERM: every server stopped, what was measured kept",
}


def table() -> str:
    """The exit statuses as `--help` prints them, one per line."""
    return "exit status:\n" + "\n".join(textwrap.fill(MEANING[code], 100, initial_indent=f"  {code.value:<4} ",
                                                      subsequent_indent=" " * 7) for code in Exit)


def short() -> str:
    """One line of the statuses, for a subcommand's --help; `reusebench --help` has the whole table."""
    return textwrap.fill("exit status: " + ", ".join(f"{code.value} {word}" for code, word in (
        (Exit.OK, "done"), (Exit.FINDING, "a finding"), (Exit.USAGE, "a wrong command line"),
        (Exit.CONFIG, "a wrong file"), (Exit.BUSY, "busy"), (Exit.INTERRUPTED, "interrupted")))
        + "; what each means: reusebench --help", 100)
