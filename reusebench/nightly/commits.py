"""Which llama.cpp commits a night measures: per branch, those after the newest one measured, newest first, capped."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path


class NightlyError(ValueError):
    """A nightly that cannot start as configured: the message names the file, field or option."""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NightlyError(f"{repo}: git {' '.join(args)}: {done.stderr.strip().splitlines()[-1:] or ['failed']}")
    return done.stdout.strip()


def measured(asv_results: Path, machine: str) -> set[str]:
    """The commits asv holds results for on `machine` (each result file names its commit)."""
    found = set()
    for path in (asv_results / machine).glob("*.json"):
        if path.name != "machine.json":
            commit = json.loads(path.read_text()).get("commit_hash")
            found.update([commit] if commit else [])
    return found


def to_measure(repo: Path, branches: Sequence[str], done: set[str], max_commits: int) -> list[str]:
    """The commits to measure tonight, oldest first: per branch, its first-parent commits newer than its newest
    measured one (with none measured: its newest), at most `max_commits` of them, the newest kept."""
    chosen: list[str] = []
    for branch in branches:
        history = git(repo, "rev-list", "--first-parent", branch, "--").split()  # newest first
        new: list[str] = []
        for commit in history:
            if commit in done or commit in chosen:
                break
            new.append(commit)
        chosen.extend(reversed(new[:max_commits]))
    return chosen
