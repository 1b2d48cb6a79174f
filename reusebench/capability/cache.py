"""A binary's capabilities, probed once and kept by the hash of the executable that really runs.

The key is the sha256 of the llama-server executable and of the shared libraries beside it (a build
with ``BUILD_SHARED_LIBS`` keeps libllama and libggml there), not of what a profile names: a launcher
script that execs another build keeps its own hash while the build behind it changes. So a file that
is not an ELF executable is started once, and the executable its process group runs, with that
process's environment, is read from ``/proc``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from reusebench.capability import Capabilities, build_probes
from reusebench.llama.binaries import Binary, BinaryError
from reusebench.llama.client import ClientError
from reusebench.llama.process import ServerError
from reusebench.llama.server import Server
from reusebench.records import file_sha256

CACHE_ENV = "REUSEBENCH_CAPABILITY_CACHE"
ELF_MAGIC = b"\x7fELF"
FILE_VERSION = 9  # bump when a probe changes what it shows: every cached result is probed again


@dataclass(frozen=True)
class Executable:
    """The llama-server ELF file that runs, and the environment a launcher gave it (None: this process's)."""

    path: Path
    env: Mapping[str, str] | None = None

    def key(self) -> str:
        """sha256 over the executable and the shared libraries in its directory, names and contents."""
        digest = hashlib.sha256()
        for part in [self.path, *sorted(self.path.parent.glob("lib*.so*"))]:
            digest.update(f"{part.name}\n{file_sha256(part)}\n".encode())
        return digest.hexdigest()


def cache_dir() -> Path:
    """`$REUSEBENCH_CAPABILITY_CACHE`, else `~/.cache/reusebench/capabilities`."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "capabilities"


def executable(binary: Binary) -> Executable:
    """What runs when `binary` is started: itself, or the executable (and environment) its launcher starts."""
    if _is_elf(binary.path):
        return Executable(binary.path)
    with Server.of(binary.path, ["-m", str(build_probes.model()), "-c", "256", "-np", "1"],
                   call_timeout_s=build_probes.CALL_TIMEOUT_S) as server:
        assert server.process.pid is not None
        found = _group_processes(server.process.pid)
    elf = [(exe, env) for exe, env in found if _is_elf(exe) and exe.name == "llama-server"] or \
        [(exe, env) for exe, env in found if _is_elf(exe) and "llama" in exe.name]
    if not elf:
        raise ServerError(f"{binary.path} is not an ELF file and started no llama-server executable "
                          f"(its processes run {', '.join(str(exe) for exe, _ in found) or 'nothing readable'})")
    return Executable(*elf[0])


def _group_processes(pgid: int) -> list[tuple[Path, dict[str, str]]]:
    """(executable, environment) of every process in group `pgid` that this user may read."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    pairs = (entry / "environ").read_bytes().split(b"\0")
                    env = dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
                    found.append((Path(os.readlink(entry / "exe")), env))
            except OSError:
                continue
    return found


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(4) == ELF_MAGIC
    except OSError:
        return False


def path_of(key: str) -> Path:
    return cache_dir() / f"{key}.json"


def cached(binary: Binary) -> Capabilities | None:
    """What the probes showed for `binary` before, without running anything; None when never probed (or when
    finding the executable would need a start: a launcher)."""
    if not _is_elf(binary.path):
        return None
    try:
        return _read(path_of(Executable(binary.path).key()))
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


def store(key: str, capabilities: Capabilities, executable_path: Path) -> Path:
    """Write the result whole or not at all: a reader, or another run probing the same build, never sees half."""
    path = path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": FILE_VERSION, "executable": str(executable_path), "capabilities": capabilities.to_dict()}
    descriptor, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}-", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(json.dumps(body, indent=2) + "\n")
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
    return path


def of_binary(binary: Binary, say: Callable[[str], None] = lambda _m: None, *, again: bool = False) -> Capabilities:
    """`binary`'s capabilities: cached by its executable's key, else probed now (about 2 s) and kept.

    A build the probes cannot run on (a fake server, a binary that does not start) gets the pinned build's rules,
    with why in ``how``; a server among the probes' that does not start leaves only its capabilities unshown.
    """
    try:
        real = executable(binary)
        key = real.key()
    except (OSError, ServerError, ClientError) as error:
        return Capabilities(how=f"not probed: {build_probes.first_line(error)}")
    if not again:
        found = _read(path_of(key))
        if found is not None:
            return found
    try:
        # the build itself: a launcher's extra flags are not its rules, its environment may be needed to run
        probed = build_probes.probe(Binary(real.path), say, env=real.env)
    except (ServerError, ClientError, BinaryError, OSError, ValueError, KeyError) as error:
        return Capabilities(how=f"not probed: {type(error).__name__}: {build_probes.first_line(error)}")
    try:
        store(key, probed, real.path)
    except OSError as error:  # a read-only cache: the result still holds for this run
        say(f"capabilities not kept ({error.strerror}): probed again next time")
    return replace(probed, how="probed")
