"""Which llama-server binary to run, and what its `--help` and `--version` say.

A profile names its binary as `default` (the portable CPU build of the pinned llama.cpp
release that `reusebench build` makes), `default:cuda` (its CUDA build), or a path. The
binary's own help is the only authority on which options exist: flags get renamed and
removed between builds.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reusebench.llama import builder
from reusebench.machine import host
from reusebench.reader import did_you_mean, expand_env

DEFAULT = "default"
HELP_TIMEOUT_S = 30.0

# Help rows are "NAMES [ARG]" padded to this column, then the description.
_HELP_DESCRIPTION_COLUMN = 40
_LONG_OPTION = re.compile(r"--[A-Za-z0-9][A-Za-z0-9._-]*")
_REMOVED_MARKER = "the argument has been removed"
# An argument placeholder that stands for a number; a value that is not one makes llama-server exit at start-up.
_NUMBER_PLACEHOLDER = "N"
_HELP_DEFAULT = re.compile(r"\(default: ([^)\[]+)\)")
_HELP_DEFAULT_NUMBER = re.compile(r"\(default: (-?\d+(?:\.\d+)?)")

# Long options that exist only in some llama.cpp builds, by the release that added or dropped them: one
# build's --help cannot say that a name it lacks is newer or older than the build, so these facts live here.
ADDED_IN: dict[str, str] = {
    name: "b11434"
    for name in ("log-jsonl", "kv-unified-per-slot", "mmproj-device", "n-cpu-ffn", "lazy-mode", "spec-draft-sampling")
}
# (release that dropped it, the option that took its place)
GONE_IN: dict[str, tuple[str, str]] = dict.fromkeys(("mlock", "mmap", "no-mmap", "direct-io"),
                                                    ("b11434", "load-mode"))


class BinaryError(Exception):
    """A binary that cannot be used; the message names where it was configured."""


@dataclass(frozen=True)
class Binary:
    """A llama-server executable."""

    path: Path


@dataclass(frozen=True)
class HelpOption:
    """One long option as `--help` describes it."""

    name: str
    takes_value: bool
    removed: bool  # still listed, but using it is an error ("the argument has been removed")
    description: str
    placeholder: str | None = None  # the argument as --help names it ("N", "FNAME"); None for a bare flag

    @property
    def default(self) -> str | None:
        """What "(default: ...)" in the description says, e.g. "32" or "disabled"; None when it says nothing."""
        match = _HELP_DEFAULT.search(self.description)
        return match.group(1).strip() if match else None

    @property
    def default_number(self) -> str | None:
        """The number the stated default starts with ("0.80", "-1"), as written; None when it is not a number."""
        match = _HELP_DEFAULT_NUMBER.search(self.description)
        return match.group(1) if match else None


def resolve_binary(value: str | None, *, source: str, relative_to: Path | None = None) -> Binary:
    """Turn a profile's `binary` value into a runnable Binary.

    `None` or "default" is the pinned release's portable CPU build, "default:FLAVOR" its
    build of that flavor (cuda); anything else is a path (`${ENV}` expanded, relative
    paths taken from `relative_to`).
    """
    expanded = expand_env(value or DEFAULT, source=source, field_name="binary", error=BinaryError)
    name, _, flavor = expanded.partition(":")
    if name == DEFAULT:
        return _built_binary(flavor or "cpu", source)
    path = Path(expanded).expanduser()
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    if not path.is_file():
        raise BinaryError(f"{source}: binary: {path} does not exist")
    if not os.access(path, os.X_OK):
        raise BinaryError(f"{source}: binary: {path} is not executable")
    return Binary(path=path.resolve())


def _built_binary(flavor: str, source: str) -> Binary:
    if flavor not in builder.FLAVORS:
        raise BinaryError(f"{source}: binary: unknown build flavor in 'default:{flavor}' "
                          f"(choose from {', '.join(builder.FLAVORS)})")
    path = builder.pinned_binary(flavor)
    if not path.is_file():
        command = "reusebench build" + ("" if flavor == "cpu" else f" --flavor {flavor}")
        raise BinaryError(f"{source}: binary: the default llama-server ({builder.PINNED.requirement}, {flavor}) is not "
                          f"built yet: run `{command}` (`make setup` runs it for the CPU build)")
    return Binary(path=path)


def help_table(binary: Binary) -> Mapping[str, HelpOption]:
    """Every long option in `binary --help`, keyed by name without "--"."""
    return _parse_help_cached(binary.path, binary.path.stat().st_mtime_ns)


def help_options(binary: Binary) -> frozenset[str]:
    """Names (without "--") of the long options this binary accepts; removed ones excluded."""
    return _accepted(help_table(binary))


def _accepted(table: Mapping[str, HelpOption]) -> frozenset[str]:
    return frozenset(name for name, option in table.items() if not option.removed)


def option_problem(table: Mapping[str, HelpOption], name: str, value: str | int | float | bool) -> str | None:
    """What is wrong with passing ``--name value`` to the binary whose `--help` is `table`; None when nothing is.

    `value` is True for a bare flag. An option whose placeholder is N and whose --help states a numeric default
    takes a number of that kind: an integer for "(default: 32)", any number for "(default: 0.80)". Without a
    stated number the kind is unknown (``--n-gpu-layers N`` also takes "auto" and "all"), so it is not checked.
    """
    entry = table.get(name)
    if entry is None:
        if name in ADDED_IN:
            why = f" (it exists from llama.cpp {ADDED_IN[name]})"
        elif name in GONE_IN:
            release, successor = GONE_IN[name]
            why = f" (llama.cpp {release} dropped it; see --{successor})"
        else:
            why = did_you_mean(name, _accepted(table))
        return f"unknown llama-server option{why}; flags get renamed and removed between builds"
    if entry.removed:
        return f"removed from this llama-server: {entry.description}"
    if entry.takes_value and value is True:
        return f"--{name} takes a value; true is only for bare flags"
    if not entry.takes_value and not isinstance(value, bool):
        return f"--{name} is a bare flag; write true to pass it or false to leave it out, not {value!r}"
    if entry.placeholder == _NUMBER_PLACEHOLDER and entry.default_number is not None and not isinstance(value, bool):
        decimals = "." in entry.default_number
        if not _is_number(value, integer=not decimals):
            return f"--{name} takes {'a number' if decimals else 'an integer'} (N in --help), not {value!r}"
    return None


def _is_number(value: str | int | float, *, integer: bool) -> bool:
    try:
        (int if integer else float)(str(value))  # llama-server's stoi would read "32K" as 32: not a number here
    except ValueError:
        return False
    return True


def version(binary: Binary) -> str:
    """What the binary is: for a `reusebench build`, its version, commit, flavor and flags;
    otherwise the commit it reports (e.g. "7e4c0a9"), else its first version line."""
    info = builder.read_build_info(binary.path)
    if info:
        return builder.describe(info)
    text = _run(binary, "--version")
    # Two layouts: "version: 0.1.0-dev (build 1, commit 7e4c0a9)" and upstream's "version: 4567 (abc1234)".
    match = re.search(r"commit ([0-9a-f]{6,40})", text) or re.search(r"version: \d+ \(([0-9a-f]{6,40})\)", text)
    if match:
        return match.group(1)
    return text.strip().splitlines()[0] if text.strip() else "unknown"


def build_label(binary: Binary, served: str | None) -> str:
    """A record's `build`: what `reusebench build` says it built, else the server's own build_info."""
    info = builder.read_build_info(binary.path)
    return builder.describe(info) if info else (served or "unknown")


@functools.lru_cache(maxsize=16)
def _parse_help_cached(path: Path, mtime_ns: int) -> Mapping[str, HelpOption]:
    return parse_help(_run(Binary(path=path), "--help"))


# Architecture names in every llama.cpp since 2024: a file with none of them does not hold the table.
_ARCHITECTURE_TABLE_MARKERS = (b"gpt-neox\0", b"starcoder2\0", b"deepseek2\0")


def knows_architecture(binary: Binary, architecture: str) -> bool | None:
    """Whether `binary` has `architecture` (a GGUF's general.architecture) in its table of architecture names;
    None when the file holds no such table (a wrapper script, a build with a shared libllama).

    llama.cpp keeps that table as string literals; an older build lacks the names of later architectures.
    (Starting the server does not tell reliably: it may exit before its log has the loader's error line.) The
    name is matched as the end of a string, since a linker may store it as the tail of a longer one.
    """
    contents = _contents_cached(binary.path, binary.path.stat().st_mtime_ns)
    if not any(marker in contents for marker in _ARCHITECTURE_TABLE_MARKERS):
        return None
    return architecture.encode() + b"\0" in contents


@functools.lru_cache(maxsize=4)
def _contents_cached(path: Path, mtime_ns: int) -> bytes:
    return path.read_bytes()


def death_by_signal(code: int, binary: Path) -> str | None:
    """One line on why a process that exited with `code` died by a signal; None if it exited itself."""
    if code >= 0:
        return None
    try:
        sig: signal.Signals | None = signal.Signals(-code)
    except ValueError:
        sig = None
    name = sig.name if sig else f"signal {-code}"
    if sig is signal.SIGILL:
        missing = ", ".join(host.missing_cpu_features()) or "none of the usual kernel extensions"
        return (f"{binary} died with SIGILL: this llama-server build uses CPU instructions this machine lacks "
                f"(CPU: {host.cpu_model() or 'unknown'}, missing: {missing}); build it with `reusebench build`")
    cause = {signal.SIGKILL: "out of memory? see `dmesg`", signal.SIGSEGV: "a crash in llama-server",
             signal.SIGBUS: "the model file changed or was truncated while mapped?"}.get(sig) if sig else None
    return f"{binary} was killed by {name}" + (f" ({cause})" if cause else "")


def _run(binary: Binary, flag: str) -> str:
    try:
        done = subprocess.run(
            [str(binary.path), flag],
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BinaryError(f"{binary.path} {flag}: {error}") from error
    if done.returncode != 0:
        raise BinaryError(death_by_signal(done.returncode, binary.path)
                          or f"{binary.path} {flag} exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    # --version prints to stderr, --help to stdout.
    return done.stdout + done.stderr


def parse_help(text: str) -> dict[str, HelpOption]:
    """Parse llama.cpp's help layout.

    A row starts in column 0 with comma-separated names ("-c,    --ctx-size N",
    "--mmap, --no-mmap", "-kvo,  --kv-offload, -nkvo, --no-kv-offload"), then an
    optional argument placeholder, then the description from column 40 or, when
    the names are too long, on indented continuation lines.
    """
    options: dict[str, HelpOption] = {}
    rows = _help_rows(text.splitlines())
    for header, description in rows:
        names, rest = _split_names(header)
        for name in names:
            options.setdefault(
                name,
                HelpOption(
                    name=name,
                    takes_value=bool(rest),
                    removed=description.lower().startswith(_REMOVED_MARKER),
                    description=description,
                    placeholder=rest[0] if rest else None,
                ),
            )
    return options


def _help_rows(lines: list[str]) -> list[tuple[str, str]]:
    """(header, joined description) for each row that starts with an option."""
    rows: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("-") and not line.startswith("-----"):
            header, description = _split_row(line)
            rows.append((header, [description] if description else []))
        elif rows and line.startswith(" ") and line.strip():
            rows[-1][1].append(line.strip())
    return [(header, " ".join(parts)) for header, parts in rows]


def _split_row(line: str) -> tuple[str, str]:
    column = _HELP_DESCRIPTION_COLUMN
    if len(line) > column and line[column - 2 : column] == "  ":
        return line[:column].rstrip(), line[column:].strip()
    return line.rstrip(), ""


def _split_names(header: str) -> tuple[list[str], list[str]]:
    """Long names of a header, and the argument tokens after the last name."""
    tokens = header.split()
    names: list[str] = []
    for index, token in enumerate(tokens):
        bare = token.rstrip(",")
        if _LONG_OPTION.fullmatch(bare):
            names.append(bare[2:])
        if not token.endswith(","):
            return names, tokens[index + 1 :]
    return names, []
