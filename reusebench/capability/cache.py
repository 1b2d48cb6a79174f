"""A binary's capabilities, probed once and kept by the hash of the executable that really runs.

The key is the sha256 of the llama-server executable, not of what a profile names: a launcher script
that execs another build keeps its own hash while the build behind it changes. So a file that is not
an ELF executable is started once (the probes' first server) and the executable its process group
runs is read from ``/proc``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from reusebench.capability import probes
from reusebench.capability.capabilities import Capabilities
from reusebench.llama.binaries import Binary
from reusebench.llama.client import ClientError
from reusebench.llama.server import LlamaServer, ServerError

CACHE_ENV = "REUSEBENCH_CAPABILITY_CACHE"
ELF_MAGIC = b"\x7fELF"
FILE_VERSION = 4  # bump when a probe changes what it shows: every cached result is probed again


def cache_dir() -> Path:
    """`$REUSEBENCH_CAPABILITY_CACHE`, else `~/.cache/reusebench/capabilities`."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "capabilities"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def executable(binary: Binary) -> Path:
    """The ELF file that runs when `binary` is started: itself, or what its launcher starts."""
    with open(binary.path, "rb") as file:
        if file.read(4) == ELF_MAGIC:
            return binary.path
    server = LlamaServer(binary.path, ["-m", str(probes.model()), "-c", "256", "-np", "1"])
    with server:
        assert server.pid is not None
        found = _group_executables(server.pid)
    elf = [path for path in found if _is_elf(path) and path.name == "llama-server"] or \
        [path for path in found if _is_elf(path) and "llama" in path.name]
    if not elf:
        raise ServerError(f"{binary.path} is not an ELF file and started no llama-server executable "
                          f"(its processes run {', '.join(map(str, found)) or 'nothing readable'})")
    return elf[0]


def _group_executables(pgid: int) -> list[Path]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(Path(os.readlink(entry / "exe")))
            except OSError:
                continue
    return found


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == ELF_MAGIC
    except OSError:
        return False


def path_of(digest: str) -> Path:
    return cache_dir() / f"{digest}.json"


def cached(binary: Binary) -> Capabilities | None:
    """What the probes showed for `binary` before, without running anything; None when never probed (or when
    finding the executable would need a start)."""
    try:
        if not _is_elf(binary.path):
            return None
        return _read(path_of(sha256_of(binary.path)))
    except OSError:
        return None


def _read(path: Path) -> Capabilities | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("version") != FILE_VERSION:
        return None
    try:
        return Capabilities.from_dict(data["capabilities"], how="probed (cached)")
    except (KeyError, TypeError, ValueError):
        return None  # written by another reusebench: probe again


def store(digest: str, capabilities: Capabilities, executable_path: Path) -> Path:
    path = path_of(digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": FILE_VERSION, "executable": str(executable_path), "capabilities": capabilities.to_dict()}
    scratch = path.with_suffix(".partial")
    scratch.write_text(json.dumps(body, indent=2) + "\n")
    scratch.replace(path)  # whole or not at all: a reader never sees half a file
    return path


def of_binary(binary: Binary, say: Callable[[str], None] = lambda _m: None, *, again: bool = False) -> Capabilities:
    """`binary`'s capabilities: cached by its executable's hash, else probed now (under 30 s) and kept.

    A build the probes cannot run on (it does not know the tiny hybrid's architecture, a fake server) gets the
    pinned build's rules, with why in ``how``.
    """
    try:
        real = executable(binary)
        digest = sha256_of(real)
    except (OSError, ServerError, ClientError) as error:
        return Capabilities(how=f"not probed: {error}")
    if not again:
        found = _read(path_of(digest))
        if found is not None:
            return found
    try:
        probed = probes.probe(Binary(real), say)  # the build itself: a launcher's extra flags are not its rules
    except (ServerError, ClientError, ValueError, KeyError) as error:
        return Capabilities(how=f"not probed: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
    store(digest, probed, real)
    return replace(probed, how="probed")
