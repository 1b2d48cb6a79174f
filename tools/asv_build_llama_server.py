"""Build llama.cpp's llama-server for one commit, cache it, and record it for the asv benchmarks.

asv.llama.conf.json runs, for each llama.cpp commit it benchmarks:

    python tools/asv_build_llama_server.py install {build_dir} {commit} {env_dir}
    python tools/asv_build_llama_server.py uninstall {env_dir}

`install` configures and builds the `llama-server` target of the checkout in
`build_dir` with CMake (unless this commit was already built with the same flags),
copies the binary into a cache keyed by commit and flags, and writes
`{env_dir}/reusebench-llama-server.json`, which benchmarks/common.py reads.

Environment:
  REUSEBENCH_CMAKE_ARGS         extra CMake arguments, e.g. "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
  REUSEBENCH_LLAMA_BUILD_CACHE  cache directory (default: ~/.cache/reusebench/llama-server-builds)
  REUSEBENCH_BUILD_JOBS         parallel build jobs (default: the number of CPUs)

Standard library only: asv runs it with the benchmarking Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

INSTALLED_FILE = "reusebench-llama-server.json"  # read by benchmarks/common.py
TARGET = "llama-server"
# A static binary stays runnable after it is copied out of the build tree; libcurl is
# only for downloading models, which the benchmarks never do (and its headers are
# often missing). REUSEBENCH_CMAKE_ARGS come last, so they can override these.
BASE_CMAKE_ARGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF")


class BuildError(Exception):
    pass


def cmake_args() -> list[str]:
    return [*BASE_CMAKE_ARGS, *shlex.split(os.environ.get("REUSEBENCH_CMAKE_ARGS", ""))]


def cache_root() -> Path:
    configured = os.environ.get("REUSEBENCH_LLAMA_BUILD_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "llama-server-builds"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def cached_binary(commit: str, args: list[str]) -> Path:
    return cache_root() / f"{commit}-{_digest(*args)}" / TARGET


def build(source: Path, commit: str, args: list[str]) -> Path:
    """The cached llama-server of `commit` built with `args`; built now if missing."""
    binary = cached_binary(commit, args)
    if binary.is_file():
        print(f"{TARGET} {commit[:12]}: cached at {binary}", flush=True)
        return binary
    if not (source / "CMakeLists.txt").is_file():
        raise BuildError(f"{source}: no CMakeLists.txt; is the asv `repo` a llama.cpp clone?")
    # One build tree per source directory and flags, outside the checkout (asv cleans
    # it with `git clean -fdx`): the next commit rebuilds only what changed.
    tree = cache_root() / f"tree-{_digest(str(source.resolve()), *args)}"
    jobs = os.environ.get("REUSEBENCH_BUILD_JOBS") or str(os.cpu_count() or 1)
    started = time.monotonic()
    _run(["cmake", "-S", str(source), "-B", str(tree), *args])
    _run(["cmake", "--build", str(tree), "--target", TARGET, "--parallel", jobs])
    built = tree / "bin" / TARGET
    if not built.is_file():
        raise BuildError(f"the build finished but {built} does not exist")
    _run([str(built), "--version"])  # a binary that cannot start fails here, not in every benchmark
    # Copy, then rename: an interrupted build never leaves a half-written cached binary.
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{TARGET}.partial")
    shutil.copy2(built, partial)
    partial.replace(binary)
    (binary.parent / "build.json").write_text(json.dumps(
        {"commit": commit, "cmake_args": args, "build_seconds": round(time.monotonic() - started, 1)}, indent=2))
    print(f"{TARGET} {commit[:12]}: built in {time.monotonic() - started:.0f} s -> {binary}", flush=True)
    return binary


def _run(argv: list[str]) -> None:
    print("+ " + shlex.join(argv), flush=True)
    try:
        subprocess.run(argv, check=True)
    except FileNotFoundError as error:
        raise BuildError(f"{argv[0]}: not found; install it (CMake 3.14+ and a C++17 compiler)") from error
    except subprocess.CalledProcessError as error:
        raise BuildError(f"`{shlex.join(argv)}` failed with exit status {error.returncode}") from error


def install(source: Path, commit: str, env_dir: Path) -> None:
    args = cmake_args()
    binary = build(source, commit, args)
    record = {"commit": commit, "binary": str(binary), "cmake_args": args}
    (env_dir / INSTALLED_FILE).write_text(json.dumps(record, indent=2) + "\n")


def uninstall(env_dir: Path) -> None:
    (env_dir / INSTALLED_FILE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    do_install = commands.add_parser("install", help="build (or take from the cache) and record the binary")
    do_install.add_argument("source", type=Path, help="the llama.cpp checkout (asv's {build_dir})")
    do_install.add_argument("commit", help="its commit hash (asv's {commit})")
    do_install.add_argument("env_dir", type=Path, help="asv's {env_dir}, where the record is written")
    do_uninstall = commands.add_parser("uninstall", help="forget the recorded binary")
    do_uninstall.add_argument("env_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            install(args.source, args.commit, args.env_dir)
        else:
            uninstall(args.env_dir)
    except BuildError as error:
        print(f"asv_build_llama_server: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
