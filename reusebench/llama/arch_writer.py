"""llama.cpp's own ``test-llama-archs``, built from the pinned release's tree: it writes a random model of any
architecture the build knows (``-a REGEX -o DIR``).

It is compiled against the static libraries of the pinned llama-server's build tree (libllama, libggml, the common
library), so it costs one compile and link (about half a minute on 2 cores), not a second build of llama.cpp with
its tests turned on. It is cached beside the pinned llama-server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from reusebench.llama import builder, sources

TOOL = "test-llama-archs"
# The link order of llama-server's own link line in the pinned build tree (build.ninja), without the server's parts.
LIBRARIES = ("common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a", "ggml/src/libggml.a",
             "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a", "vendor/hash/libvendor-hash.a")
LIBRARY_TARGET = "llama-common"  # builds libllama and ggml with it


def path(progress: Callable[[str], None] = print) -> Path:
    """The cached test-llama-archs of the pinned release; built now if missing (the pinned llama-server first)."""
    source = sources.fetch_pinned(progress)
    args = builder.cmake_args(source)
    server = builder.build(source, args, progress=progress)
    tool = server.with_name(TOOL)
    if tool.is_file():
        return tool
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise builder.BuildError(f"no C++ compiler to build {TOOL} (apt-get install g++)")
    with builder.staged(source) as copy:  # the server's build tree holds the libraries, of this tree while held
        tree = builder.build_tree(copy, args)
        jobs = int(os.environ.get(builder.JOBS_ENV) or os.cpu_count() or 1)
        # up to date after the server's own build (ninja does nothing); after another tree's, its objects are
        # the compiler cache's
        builder.build_target(copy, args, LIBRARY_TARGET, jobs=jobs, progress=progress, what=f"{source.label} for {TOOL}")
        includes = [copy.tree / "common", copy.tree / "include", copy.tree / "ggml" / "include", copy.tree / "src",
                    copy.tree / "vendor"]
        partial = tool.with_name(f"{TOOL}.partial")
        argv = [compiler, "-O1", "-std=c++17", "-DGGML_USE_CPU", *[f"-I{include}" for include in includes],
                str(copy.tree / "tests" / f"{TOOL}.cpp"), "-o", str(partial),
                *[str(tree / library) for library in LIBRARIES], "-ldl", "-lm", "-fopenmp", "-lpthread"]
        progress(f"compiling {TOOL} of {source.label} against its llama-server's libraries")
        done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise builder.BuildError(f"compiling {TOOL} failed: {done.stderr.strip()[-1200:]}")
    partial.replace(tool)
    return tool
