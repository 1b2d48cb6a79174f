"""The command line's parser: the program's description and every command's subparser, in the order --help lists them."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

from reusebench.cli import (
    advise,
    bisect,
    build,
    check,
    common,
    fuzz,
    inspect_model,
    nightly,
    replay,
    report,
    run,
    shipped,
    tap,
    whatif,
)
from reusebench.llama import builder

DESCRIPTION = """Does llama-server really reuse the prompts it has already read? reusebench sends realistic sequences of long
prompts (resend, re-ask, an edit, another document in between, a restart) to llama-server and records, for each
step, how many tokens it re-processed against what a perfect cache would, why (from the server's log), and
whether the reused output equals output computed without reuse."""

# each adds its command's subparser, with its arguments and `func`, the function that runs it
COMMANDS: tuple[Callable[[common.Subparsers], None], ...] = (
    run.add_run, run.add_workload, replay.add_replay, whatif.add_whatif, tap.add_tap, report.add_report, check.add_check, report.add_view,
    nightly.add_nightly, nightly.add_compare, bisect.add_bisect, fuzz.add_fuzz, nightly.add_site,
    advise.add_agreement, advise.add_advise, shipped.add_profiles, tap.add_log_filter, check.add_probe,
    build.add_build, shipped.add_models, inspect_model.add_inspect,
)


def version() -> str:
    """What `--version` prints: this package's version and the llama.cpp release `default` builds."""
    return (f"reusebench {metadata.version('reusebench')} (llama-server default: llama.cpp "
            f"b{builder.PINNED.build_number}, {builder.PINNED.requirement})")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`argv` parsed; an option the command does not have is refused by the command's own parser (its usage line,
    not the whole program's) with the closest option it has, so `--szie 8K` says "did you mean --size?"."""
    # argparse keeps its subcommands' parsers on the subparsers action, with no public way to reach them
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    valued = {o for command in commands.values() for a in command._actions if a.option_strings and a.nargs != 0
              for o in a.option_strings}
    args, unknown = parser.parse_known_args(_joined_negatives(sys.argv[1:] if argv is None else argv, valued))
    if unknown:
        command = commands[args.command]
        options = [o for action in command._actions for o in action.option_strings if o.startswith("--")]
        guesses = {word: difflib.get_close_matches(word.split("=")[0], options, n=1) for word in unknown
                   if word.startswith("--")}
        hint = "; ".join(f"{word.split('=')[0]}: did you mean {found[0]}?" for word, found in guesses.items() if found)
        command.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({hint})" if hint else ""))
    return args


def _joined_negatives(argv: Sequence[str], valued: set[str]) -> list[str]:
    """`--size -8K` as `--size=-8K`: argparse takes a value that starts with "-" (other than a plain number) for an
    option and says only "expected one argument"; joined, the option's own check names what is wrong."""
    joined: list[str] = []
    for word in argv:
        if joined and joined[-1] in valued and re.fullmatch(r"-\d\S*", word):
            joined[-1] += f"={word}"
        else:
            joined.append(word)
    return joined


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reusebench", description=DESCRIPTION, epilog=common.EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser
