"""asv's install hook (asv.llama.conf.json's install_command): build one llama.cpp commit and record its
llama-server in asv's environment, where benchmarks/common.py finds it."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from reusebench.llama.builder import build, cmake_args
from reusebench.llama.sources import git_source, revision

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
    record = {"commit": revision(tree, commit), "binary": str(binary), "cmake_args": args}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return binary
