"""A stand-in llama.cpp clone from released source trees, for the nightly over real history without llama.cpp's
own repository: one commit per tree, in release order, and fixes as branches off them.

Each commit's message states the tree's llama.cpp version in trailers (`sources.git_source` reads them):
`LLAMA_BUILD_NUMBER` and `LLAMA_BUILD_COMMIT` (the stand-in's own commit count is not the build number), and
for a tree as released `LLAMA_SOURCE_SHA256`, the sdist's hash, so the commit's build is the published build's
(one cached binary for the nightly, `bisect` and `build`). Dates and author are fixed, so the commit hashes are
the same on every machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reusebench.llama import builder, sources

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReleasedTree:
    """One released llama.cpp tree: where it is on PyPI and which llama.cpp version it is."""

    release: builder.PinnedRelease
    commit: str  # the upstream commit when the sdist names it, else the package it came from
    date: str  # the release date (ISO 8601), as the stand-in commit's date

    def message(self, sha256: str) -> str:
        return (f"llama.cpp b{self.release.build_number} ({self.commit}, {self.date[:10]}) "
                f"from {self.release.requirement}\n\n"
                f"{sources.BUILD_NUMBER_TRAILER}: {self.release.build_number}\n"
                f"{sources.BUILD_COMMIT_TRAILER}: {self.commit}\n"
                f"{sources.SOURCE_TRAILER}: {sha256}\n")


@dataclass(frozen=True)
class Branch:
    """A fix on a branch off one of the trees, as a fork's or a PR's branch is: the site shows it beside master."""

    name: str
    base: int  # index in the trees
    patch: Path
    date: str

    def message(self, base: ReleasedTree) -> str:
        return (f"llama.cpp b{base.release.build_number} ({base.commit}) + {self.patch.name}\n\n"
                f"{sources.BUILD_NUMBER_TRAILER}: {base.release.build_number}\n"
                f"{sources.BUILD_COMMIT_TRAILER}: {base.commit}+{self.patch.stem}\n")


def git(tree: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def _messages(repo: Path, branch: str) -> list[str]:
    log = subprocess.run(["git", "-C", str(repo), "log", "--reverse", "--format=%B%x00", branch],
                         capture_output=True, text=True)
    return [m.strip() for m in log.stdout.split("\x00") if m.strip()] if log.returncode == 0 else []


def _env(date: str) -> dict[str, str]:
    """Fixed author, committer and dates: the same commit hashes, and so the same build cache, on every machine."""
    return {**os.environ, "GIT_AUTHOR_NAME": "reusebench stand-in", "GIT_AUTHOR_EMAIL": "stand-in@localhost",
            "GIT_COMMITTER_NAME": "reusebench stand-in", "GIT_COMMITTER_EMAIL": "stand-in@localhost",
            "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}


def assemble(repo: Path, trees: tuple[ReleasedTree, ...], branches: tuple[Branch, ...] = (),
             progress: Progress = print) -> tuple[list[str], dict[str, str]]:
    """The stand-in repository: one commit per tree in order on master, and each branch's patch committed on its
    base. Returns master's commit hashes, oldest first, and each branch's head.

    Kept when it already holds exactly these commits (the messages say which trees and patches); a different
    list of trees starts it anew.
    """
    fetched = [sources.fetch_release(tree.release, progress) for tree in trees]
    wanted = [tree.message(sources.sdist_sha256(path)).strip() for tree, path in zip(trees, fetched)]
    wanted_branches = {b.name: [*wanted[:b.base + 1], b.message(trees[b.base]).strip()] for b in branches}
    if (repo / ".git").is_dir() and _messages(repo, "master") == wanted and all(
            _messages(repo, name) == messages for name, messages in wanted_branches.items()):
        return (git(repo, "rev-list", "--reverse", "master").split(),
                {b.name: git(repo, "rev-parse", b.name) for b in branches})
    shutil.rmtree(repo, ignore_errors=True)  # another set of trees, or an assembly that stopped half-way
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "master")
    for tree, path, message in zip(trees, fetched, wanted):
        for entry in repo.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        shutil.copytree(path, repo, symlinks=True, dirs_exist_ok=True)
        # Nested .git entries (the sdists' own clones) would make submodules of them.
        for nested in [p for p in repo.rglob(".git") if p.parent != repo]:
            shutil.rmtree(nested) if nested.is_dir() else nested.unlink()
        git(repo, "add", "--all", "--force", ".")  # the tree as released, its own .gitignore notwithstanding
        git(repo, "commit", "-q", "--no-verify", "-m", message, env=_env(tree.date))
        progress(f"committed {message.splitlines()[0]}")
    commits = git(repo, "rev-list", "--reverse", "master").split()
    heads = {}
    for branch in branches:
        git(repo, "checkout", "-q", "-b", branch.name, commits[branch.base])
        git(repo, "apply", "--whitespace=nowarn", str(branch.patch))
        git(repo, "add", "--all", "--force", ".")
        message = branch.message(trees[branch.base])
        git(repo, "commit", "-q", "--no-verify", "-m", message, env=_env(branch.date))
        heads[branch.name] = git(repo, "rev-parse", "HEAD")
        progress(f"committed {message.splitlines()[0]} on branch {branch.name}")
    git(repo, "checkout", "-q", "master")
    return commits, heads
