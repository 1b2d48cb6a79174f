"""Every `reusebench` command line in the README and docs/ passes the parser: its command exists, and every flag it
gives is one that command takes (users copy these lines into scripts)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from reusebench.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md",
         REPO / "workloads" / "README.md", REPO / "results" / "README.md"]
# a command in a code block or inline code: `reusebench NAME ...` up to the end of the line, a comment or the code
COMMAND = re.compile(r"(?:^|[\s`(/])reusebench ([a-z][a-z-]*)([^`#\n]*)")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def code(text: str) -> list[tuple[int, str]]:
    """(line number, code) of the page's fenced code lines and inline code spans: where a page shows a command."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            found.append((number, line.split(" #")[0]))  # a shell comment names commands in prose
        else:
            found += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
    return found


def documented() -> list[tuple[str, int, str, str]]:
    """(page, line number, command, its arguments) of every command line the pages show."""
    return [(page.relative_to(REPO).as_posix(), number, match.group(1), match.group(2))
            for page in PAGES for number, line in code(page.read_text()) for match in COMMAND.finditer(line)]


def flags(arguments: str) -> list[str]:
    """The long and short options an argument string gives ([--a X | --b] and --a=X count too)."""
    try:
        words = shlex.split(arguments.replace("[", " ").replace("]", " ").replace("|", " "))
    except ValueError:  # an unbalanced quote in prose: its words as they stand
        words = arguments.split()
    return [word.split("=")[0] for word in words if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", word)]


def test_the_pages_show_many_commands() -> None:
    assert len(documented()) > 100


@pytest.mark.parametrize(("page", "line", "command", "arguments"), documented(),
                         ids=lambda value: str(value) if not isinstance(value, str) or len(value) < 40 else "")
def test_every_documented_command_line_passes_the_parser(page: str, line: int, command: str, arguments: str) -> None:
    commands = subcommands()
    assert command in commands, f"{page}:{line}: no command `reusebench {command}`"
    known = {option for action in commands[command]._actions for option in action.option_strings}
    unknown = [flag for flag in flags(arguments) if flag not in known]
    assert unknown == [], f"{page}:{line}: `reusebench {command}` has no {', '.join(unknown)}"


def test_an_old_spelling_still_works_with_a_note_naming_the_new_one(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["run", "--profile", "tiny-llama", "--scenarios", "resend", "reask"])
    assert args.scenario == ["resend", "reask"]
    assert capsys.readouterr().err.strip() == (
        "note: --scenarios is now a repeated --scenario: --scenario resend --scenario reask")


def test_a_profile_given_the_old_way_fails_naming_the_new_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["check", "tiny-qwen35"])  # `check PROFILE` before 2026-12-04
    assert "the following arguments are required: --profile" in capsys.readouterr().err
