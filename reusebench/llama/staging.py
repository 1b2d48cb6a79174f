"""The one staged copy every llama-server build compiles: a tree after another at the same path.

Only the files that differ from the tree built there last are written (their times change, the others keep
theirs), so ninja recompiles what changed, and the compiler cache, which keys a compile by its paths and
contents, serves any file it compiled before at that path, going back and forth in a bisect included. One
build at a time holds the copy (a lock); a second waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

TREE = "llama.cpp"


@contextlib.contextmanager
def staged(tree: Path, root: Path) -> Iterator[Path]:
    """`tree`'s files at `root`/llama.cpp, held until the block ends."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sync(tree, root / TREE)
        yield root / TREE


def sync(tree: Path, copy: Path) -> int:
    """Make `copy` hold what `tree` holds, writing only the files whose bytes differ and removing what `tree`
    lacks; returns how many files were written."""
    written, wanted = 0, set()
    for directory, _, files in os.walk(tree):
        relative = Path(directory).relative_to(tree)
        (copy / relative).mkdir(parents=True, exist_ok=True)
        wanted.add(relative)
        for name in files:
            source, target = Path(directory) / name, copy / relative / name
            if not source.is_file():  # a dangling link
                continue
            wanted.add(relative / name)
            data = source.read_bytes()
            if target.is_symlink() or not target.is_file() or target.read_bytes() != data:
                target.unlink(missing_ok=True)
                target.write_bytes(data)
                shutil.copymode(source, target)
                written += 1
    for directory, _, files in os.walk(copy, topdown=False):
        relative = Path(directory).relative_to(copy)
        for name in files:
            if relative / name not in wanted:
                (Path(directory) / name).unlink()
        if relative not in wanted:
            shutil.rmtree(directory, ignore_errors=True)
    return written
