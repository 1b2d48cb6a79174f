"""asv environment type "existing-build": the Python asv runs in, with the project built per commit.

asv.llama.conf.json benchmarks llama.cpp commits. Neither stock environment fits:
"existing" never builds (so `asv run A..B` is impossible), and "virtualenv" creates
a fresh venv and pip-installs asv_runner, build and reusebench's dependencies into
it, which needs a package index. This one runs the benchmarks in the reusebench
venv asv was started from (where everything is installed) and runs the config's
install command for each commit (`reusebench build --tree ... --asv-env ...`, which
builds llama-server with CMake). Benchmarks see ASV_COMMIT and ASV_ENV_DIR, unlike in an
"existing" environment.

Loaded by asv through `"plugins": [".tools.asv_existing_build"]`, which imports it
relative to the working directory: run asv from the repository root.
"""

from __future__ import annotations

import os
import sys

from asv import environment, util


class ExistingBuild(environment.Environment):
    tool_name = "existing-build"

    def __init__(self, conf, python, requirements, tagged_env_vars):
        if python != "same":
            raise environment.EnvironmentUnavailable(
                f'existing-build runs in the Python asv runs in: use "pythons": ["same"], not {python!r}'
            )
        if conf.matrix:
            raise environment.EnvironmentUnavailable("existing-build installs no requirements: leave `matrix` empty")
        self._executable = sys.executable
        self._requirements = {}  # the base class names the environment from these before it sets them
        super().__init__(conf, f"{sys.version_info[0]}.{sys.version_info[1]}", requirements, tagged_env_vars)

    @classmethod
    def matches(cls, python):
        return python == "same"

    def _setup(self):
        # Only a directory: it holds the checkout, asv's status files and the install record.
        os.makedirs(self._path, exist_ok=True)

    def find_executable(self, executable):
        # "python" in build/install commands is this Python; other names come from its bin directory.
        if executable == "python":
            return self._executable
        return util.which(executable, [os.path.dirname(self._executable)])

    def run(self, args, **kwargs):
        # run_executable adds the ASV_* variables (ASV_COMMIT, ASV_ENV_DIR) the benchmarks read.
        return self.run_executable("python", args, **kwargs)
