"""A model's memory as the build that runs it reports it: one short start of llama-server, kept per binary and file.

The start loads the model with a small context, one slot, ``--cache-reuse`` and ``--swa-full`` (so the server
says whether the model itself can shift positions, whatever a window's cache size would be), reads the startup
lines (``llama.memory_log``) and stops. The result is kept beside the capabilities, keyed by the executable's
hash (``cache.Executable.key``) and the model file's path, size and modification time: a model of many GB is
not hashed on every run, and a file replaced in place gets a new time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from reusebench.capability import cache
from reusebench.llama import arch_source, binaries, builder, gguf_check
from reusebench.llama.binaries import Binary
from reusebench.llama.memory_log import MemoryLogError, ModelMemory, from_startup
from reusebench.llama.process import ServerError
from reusebench.llama.server import Server

FILE_VERSION = 1  # bump when what is read from the log changes: every kept memory is read again
PROBE_CTX = 1024
START_TIMEOUT_S = 600.0  # a large model from a cold disk


class ModelLoadError(RuntimeError):
    """The build cannot load the model; the message names the file and gives the server's own last line."""


def _model_key(model: Path) -> str:
    stat = model.stat()
    return hashlib.sha256(f"{model.resolve()}\n{stat.st_size}\n{stat.st_mtime_ns}".encode()).hexdigest()


def _path(binary_key: str, model: Path) -> Path:
    return cache.cache_dir() / "memory" / f"{binary_key[:24]}-{_model_key(model)[:24]}.json"


def table_of(binary: Binary) -> dict[str, str]:
    """The window types of the tree `binary` was built from (its build.json), else the pinned release's."""
    info = builder.read_build_info(binary.path)
    table = info.get("window_types") if info else None
    return dict(table) if isinstance(table, dict) else dict(arch_source.WINDOW_TYPES)


def probe_args(binary: Binary, model: Path) -> list[str]:
    """A small context and one slot; --cache-reuse and --swa-full where the build has them."""
    known = binaries.help_options(binary)
    args = ["-m", str(model), "-c", str(PROBE_CTX), "-np", "1"]
    args += ["--cache-reuse", "256"] if "cache-reuse" in known else []
    args += ["--swa-full"] if "swa-full" in known else []
    return args


@functools.lru_cache(maxsize=16)
def binary_key(path: Path, size: int, mtime_ns: int) -> str:
    """The executable's hash (``cache.Executable.key``), once per file as it is: a run resolves a launch per session,
    and each would hash the same binary again."""
    return cache.executable(Binary(path)).key()


def of_model(binary: Binary, model: Path, say: Callable[[str], None] = lambda _m: None) -> ModelMemory:
    """`model`'s memory as `binary` builds it: kept, else one start of the server now."""
    try:
        stat = binary.path.stat()
        key = binary_key(binary.path, stat.st_size, stat.st_mtime_ns)
    except (OSError, ServerError) as error:
        raise ModelLoadError(f"{binary.path}: cannot start to read {model.name}'s memory: {error}") from error
    path = _path(key, model)
    try:
        data = json.loads(path.read_text())
        if data.get("version") == FILE_VERSION:
            return ModelMemory.from_dict(data["memory"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    say(f"reading {model.name}'s memory from {binary.path.name}'s startup log (once per build and file)")
    memory = probe(binary, model)
    try:
        _store(path, memory)
    except OSError as error:
        say(f"model memory not kept ({error.strerror}): read again next time")
    return memory


def probe(binary: Binary, model: Path) -> ModelMemory:
    """One start of `binary` on `model`: its startup lines, read."""
    server = Server.of(binary.path, probe_args(binary, model), call_timeout_s=START_TIMEOUT_S)
    server.process.health_timeout_s = START_TIMEOUT_S  # a large model from a cold disk takes long to load
    try:
        with server:
            lines = server.lines_since(0)
    except ServerError as error:
        last = _first_error_line(error.log_tail or str(error))
        raise ModelLoadError(f"{model}: {binary.path.name} cannot load it: {last}") from error
    try:
        memory = from_startup(lines, table_of(binary))
    except MemoryLogError as error:
        raise ModelLoadError(f"{model}: {error}") from error
    written = gguf_check.architecture(model)
    if memory.arch != written:  # the log belongs to another model: a launcher that swaps it, a wrong file
        raise ModelLoadError(f"{model}: general.architecture is {written}, but {binary.path.name} loaded {memory.arch}")
    return memory


def _first_error_line(tail: str) -> str:
    """The server's own line that says why the load failed: the first error line of the log (the loader's; later
    ones only say that it exited), without its time and level, else its last line."""
    lines = [re.sub(r"^[\d.]+ [A-Z] ", "", line.strip()) for line in tail.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() or "failed" in line.lower():
            return line[-400:]
    return (lines[-1] if lines else "no log")[-400:]


def _store(path: Path, memory: ModelMemory) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, scratch = tempfile.mkstemp(dir=path.parent, prefix=".memory-", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(json.dumps({"version": FILE_VERSION, "memory": memory.to_dict()}, indent=2) + "\n")
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
