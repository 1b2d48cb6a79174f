"""Declarative YAML launch profiles: load, validate strictly, expand the matrix into variants.

A profile names the llama-server binary, the model (a path, `${ENV}` allowed, or a
generated `tiny:NAME` model), optional mmproj and LoRA adapters, and llama-server
options spelled as their long names. Everything is checked before a server
starts, and every error names the file and the field it comes from.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reusebench import reader, real
from reusebench.config import corpus, options
from reusebench.config.options import OptionValue
from reusebench.config.profile_files import (
    MMPROJ_AXIS,
    ProfileError,
    check_layer,
    default_profiles_dir,
    label,
    locate,
    merge,
    profile_names,
    read_chain,
)
from reusebench.config.scenarios import SCENARIO_IDS  # one list: the catalogue's
from reusebench.llama import binaries, gguf_check
from reusebench.llama.binaries import Binary, BinaryError
from reusebench.reader import Document

__all__ = [  # the profile API; reading and checking the files is profile_files'
    "MMPROJ_AXIS",
    "Outline",
    "Profile",
    "ProfileError",
    "Variant",
    "default_profiles_dir",
    "load_profile",
    "outline",
    "profile_files",
    "profile_names",
]

DEFAULT_N_PREDICT = 8
DEFAULT_CORPUS = "tiny-words"  # the tiny models' vocabulary: one token per word
REAL_PROSE_CORPUS = "python-docs"  # a real model's default: English prose shipped with Python (corpora/)
# options that name a file the profile ships: relative to the file that sets them, and there before any launch
DRAFT_MODEL_OPTION = "spec-draft-model"  # a model: `tiny:NAME` and `real:NAME` name one, as `model:` does
FILE_OPTIONS = ("chat-template-file", DRAFT_MODEL_OPTION)

@dataclass(frozen=True)
class Variant:
    """One concrete server launch of a profile: a single point of its matrix."""

    profile: str
    name: str  # "mmproj=on,cache-reuse=256", or "default" when the profile has no matrix
    binary: Binary
    model: Path
    model_spec: str  # as written in the profile, e.g. "tiny:qwen35" or "${REUSEBENCH_GLM_MODEL}"
    mmproj: Path | None
    lora: tuple[Path, ...]
    options: dict[str, OptionValue] = field(hash=False)  # only options in effect (false/null dropped)
    sizes: tuple[int, ...]  # empty when the profile names none: then the run gives them
    scenarios: tuple[str, ...]
    verify: bool
    n_predict: int

    def option(self, name: str) -> OptionValue | None:
        """The effective value of option `name` (True for a bare flag), or None when not set."""
        return self.options.get(name)

    def number(self, name: str, default: float | None = None) -> float | None:
        """Option `name` as a number, else `default` (``options.number``)."""
        return options.number(self.options, name, default)

    def server_args(self) -> list[str]:
        """Model, adapters and options as llama-server arguments; host, port and logging are the harness's."""
        args = ["-m", str(self.model)]
        if self.mmproj is not None:
            args += ["--mmproj", str(self.mmproj)]
        for adapter in self.lora:
            args += ["--lora", str(adapter)]
        for name in sorted(self.options):
            value = self.options[name]
            args += [f"--{name}"] if value is True else [f"--{name}", str(value)]
        return args


@dataclass(frozen=True)
class Profile:
    """A loaded profile: its file and the variants its matrix expands to (one server launch each)."""

    name: str
    path: Path
    description: str
    variants: tuple[Variant, ...]
    corpus: str = DEFAULT_CORPUS  # the corpus spec its sessions' documents come from (`run --corpus` overrides)

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        valid = ", ".join(variant.name for variant in self.variants)
        raise ProfileError(f"{_display(self.path)}: no variant {name!r}; valid variants: {valid}")


def profile_files(name_or_path: str | Path, profiles_dir: Path | None = None) -> list[Path]:
    """The profile's file and every file it extends, base first: what its content is made of."""
    profiles_dir = profiles_dir or default_profiles_dir()
    return [path for path, _ in read_chain(locate(name_or_path, profiles_dir), profiles_dir)]


def load_profile(
    name_or_path: str | Path,
    profiles_dir: Path | None = None,
    check_binary: bool = True,
    scenario_ids: Sequence[str] = SCENARIO_IDS,
    binary: Path | None = None,
) -> Profile:
    """Load, validate and expand a profile given by name (in `profiles_dir`) or by path.

    With `check_binary`, every option name is checked against the binary's `--help`: the profile's `binary:`,
    or `binary` where given (a bisect runs one profile on many builds).
    Tiny models named by `tiny:` specs are generated if missing.
    """
    path, merged, origins = _read_merged(name_or_path, profiles_dir or default_profiles_dir(), scenario_ids)
    return _build(path, merged, origins, check_binary, scenario_ids, binary)


@dataclass(frozen=True)
class Outline:
    """What `reusebench profiles` shows of a profile: read and checked, but no binary or model resolved."""

    name: str
    description: str
    variants: tuple[str, ...]
    settings: dict[str, tuple[str, ...]]  # variant -> the options in effect, with "mmproj" and "lora" when loaded


def outline(name_or_path: str | Path, profiles_dir: Path | None = None) -> Outline:
    """The profile's variants and what each sets, from its files alone (cheap: asv's discovery reads it)."""
    path, merged, _ = _read_merged(name_or_path, profiles_dir or default_profiles_dir(), SCENARIO_IDS)
    points = _matrix_points(merged.get("matrix", {}))
    settings = {}
    for point in points:
        loaded = [name for name, on in (("mmproj", "mmproj" in merged and dict(point).get(MMPROJ_AXIS, True)),
                                        ("lora", bool(merged.get("lora")))) if on]
        settings[_variant_name(point)] = (*_effective_options(merged.get("options", {}), point), *loaded)
    return Outline(path.stem, merged.get("description", ""), tuple(settings), settings)


def _read_merged(
    name_or_path: str | Path, profiles_dir: Path, scenario_ids: Sequence[str]
) -> tuple[Path, dict[str, Any], _Origins]:
    """The profile's file, its fields merged over the files it extends, and which file set each field."""
    path = locate(name_or_path, profiles_dir)
    chain = read_chain(path, profiles_dir)
    layers = [(file, check_layer(doc, scenario_ids)) for file, doc in chain]
    merged, origins = merge(layers)
    return path, merged, _Origins(origins, path, {file: doc for file, doc in chain})


# --- building ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Origins:
    """Which file set each merged field, for error messages."""

    files: dict[str, Path]
    profile: Path
    documents: dict[Path, Document]

    def path(self, where: str) -> Path:
        """The file that set `where` ("lora[1]" is set with "lora"); the profile itself for defaults."""
        return self.files.get(where.split("[", 1)[0], self.profile)

    def file(self, where: str) -> str:
        """"<file>:<line>:<column>" of `where` in the file that set it."""
        path = self.path(where)
        document = self.documents.get(path.resolve())
        return document.at(where) if document is not None else _display(path)


@contextlib.contextmanager
def _reported_at(origins: _Origins, where: str) -> Iterator[None]:
    """Turn errors from binaries and tiny into ProfileErrors that start with "<file>: <field>:"."""
    try:
        yield
    except ProfileError:
        raise
    except (BinaryError, ValueError) as error:
        message, prefix = str(error), f"{origins.file(where)}: "
        raise ProfileError(message if message.startswith(prefix) else f"{prefix}{where}: {message}") from error


def _build(
    path: Path, merged: dict[str, Any], origins: _Origins, check_binary: bool, scenario_ids: Sequence[str],
    binary_path: Path | None,
) -> Profile:
    if "model" not in merged:
        raise ProfileError(f"{_display(path)}: model: required (set here or in the profile it extends)")
    with _reported_at(origins, "binary"):
        binary = binaries.resolve_binary(
            merged.get("binary") if binary_path is None else str(binary_path.resolve()),
            source=origins.file("binary"), relative_to=origins.path("binary").parent
        )
    options = {
        name: _expand_value(value, origins, f"options.{name}") for name, value in merged.get("options", {}).items()
    }
    for name in FILE_OPTIONS:
        if isinstance(options.get(name), str):
            options[name] = str(_resolve_file(str(options[name]), f"options.{name}", origins))
    matrix: dict[str, list[OptionValue]] = merged.get("matrix", {})
    if check_binary:
        _check_against_help(binary, options, matrix, origins)
    mmproj = _resolve_mmproj(merged, origins) if "mmproj" in merged else None
    if MMPROJ_AXIS in matrix and mmproj is None:
        raise ProfileError(f"{origins.file('matrix.mmproj')}: matrix.mmproj: the profile sets no `mmproj:` to toggle")
    shared = dict(
        profile=path.stem,
        binary=binary,
        model=_resolve_file(merged["model"], "model", origins),
        model_spec=merged["model"],
        lora=tuple(_resolve_file(spec, f"lora[{i}]", origins) for i, spec in enumerate(merged.get("lora", []))),
        sizes=tuple(merged.get("sizes", ())),  # none: the run must name them (`--size`)
        scenarios=tuple(merged.get("scenarios", scenario_ids)),
        verify=merged.get("verify", True),
        n_predict=merged.get("n_predict", DEFAULT_N_PREDICT),
    )
    variants = tuple(
        Variant(
            name=_variant_name(point),
            mmproj=mmproj if dict(point).get(MMPROJ_AXIS, True) else None,
            options=_effective_options(options, point),
            **shared,
        )
        for point in _matrix_points(matrix)
    )
    corpus_name = merged.get("corpus", DEFAULT_CORPUS if tiny_model(str(merged["model"])) else REAL_PROSE_CORPUS)
    with _reported_at(origins, "corpus"):
        corpus.load_spec(corpus_name)  # a corpus that is not there is the profile's error, before anything runs
    return Profile(name=path.stem, path=path, description=merged.get("description", ""), variants=variants,
                   corpus=corpus_name)


def tiny_model(spec: str) -> bool:
    """A generated tiny model (`tiny:NAME`, ``tiny.SPEC_PREFIX``: not imported here, it pulls in numpy), whose seeded
    words are one token each; any other model reads real prose."""
    return spec.startswith("tiny:")


def _matrix_points(matrix: dict[str, list[OptionValue]]) -> list[tuple[tuple[str, OptionValue], ...]]:
    """Every combination of axis values, in file order; one empty point when there is no matrix."""
    axes = [[(axis, value) for value in values] for axis, values in matrix.items()]
    return list(itertools.product(*axes))


def _variant_name(point: tuple[tuple[str, OptionValue], ...]) -> str:
    """"mmproj=on,cache-reuse=256"; "default" without a matrix."""
    return ",".join(f"{axis}={label(value)}" for axis, value in point) or "default"


def _effective_options(
    options: dict[str, OptionValue], point: tuple[tuple[str, OptionValue], ...]
) -> dict[str, OptionValue]:
    effective = {**options, **{axis: value for axis, value in point if axis != MMPROJ_AXIS}}
    return {name: value for name, value in effective.items() if value is not False}


def _check_against_help(
    binary: Binary, options: dict[str, OptionValue], matrix: dict[str, list[OptionValue]], origins: _Origins
) -> None:
    """Every option and matrix value must be one this binary's `--help` accepts (``binaries.option_problem``)."""
    with _reported_at(origins, "binary"):
        table = binaries.help_table(binary)
    settings = [(f"options.{name}", name, [value]) for name, value in options.items()]
    settings += [(f"matrix.{axis}", axis, values) for axis, values in matrix.items() if axis != MMPROJ_AXIS]
    for where, name, values in settings:
        for value in values:
            problem = binaries.option_problem(table, name, value)
            if problem is not None:
                raise ProfileError(f"{origins.file(where)}: {where}: {problem}; see `{binary.path} --help`")


def _expand_value(value: OptionValue, origins: _Origins, where: str) -> OptionValue:
    if not isinstance(value, str):
        return value
    with _reported_at(origins, where):
        return reader.expand_env(value, source=origins.file(where), field_name=where, error=ProfileError)


TINY_PROJECTOR = "projector"  # `mmproj: tiny:projector`: generated for the profile's model


def _resolve_mmproj(merged: Mapping[str, Any], origins: _Origins) -> Path:
    """The profile's mmproj; `tiny:projector`: a tiny projector generated as wide as the profile's model (any
    model, a real one too), so images reach a model that ships none."""
    if merged["mmproj"] != f"tiny:{TINY_PROJECTOR}":
        return _resolve_file(merged["mmproj"], "mmproj", origins)
    from reusebench import tiny  # imported lazily: it pulls in numpy and gguf

    model = _resolve_file(merged["model"], "model", origins)
    with _reported_at(origins, "mmproj"):
        return tiny.projector_path(gguf_check.embedding_length(model))


def _resolve_file(spec: str, where: str, origins: _Origins) -> Path:
    """A model, mmproj, LoRA or option file (by `where`): `tiny:NAME` (generated if missing), `real:NAME` (a model
    installed by `reusebench models --real`) or an existing path."""
    with _reported_at(origins, where):
        from reusebench import tiny  # imported lazily: it pulls in numpy and gguf

        # a model, mmproj or adapter may be generated or installed; a draft model too
        a_model = where in ("model", f"options.{DRAFT_MODEL_OPTION}")
        named = a_model or not where.startswith("options.")
        if named and real.is_real_spec(spec):
            if not a_model:
                raise ProfileError(f"{origins.file(where)}: {where}: {spec}: a real model is a `model:` or a "
                                   f"draft model (`{DRAFT_MODEL_OPTION}`)")
            return real.model_path(spec.removeprefix(real.SPEC_PREFIX))
        if named and tiny.is_tiny_spec(spec):
            name = spec.removeprefix(tiny.SPEC_PREFIX)
            if a_model:
                return tiny.model_path(name)
            return tiny.mmproj_path(name) if where == "mmproj" else tiny.lora_path(name)
        expanded = Path(reader.expand_env(spec, source=origins.file(where), field_name=where,
                                          error=ProfileError)).expanduser()
    path = expanded if expanded.is_absolute() else origins.path(where).parent / expanded
    if not path.is_file():
        raise ProfileError(f"{origins.file(where)}: {where}: {path} does not exist")
    if path.suffix == ".gguf":  # a corrupt or truncated model: an error naming file and field, before any launch
        from reusebench.llama.gguf_check import GgufError, check_gguf

        try:
            check_gguf(path)
        except GgufError as error:
            raise ProfileError(f"{origins.file(where)}: {where}: {error}") from error
    return path



_display = reader.display


@dataclass(frozen=True)
class ForThisBuild:
    """A profile as its build can run it: loaded, the variants it cannot run dropped with why, then checked."""

    profile: Profile
    runnable: list[str]  # variant names, in the profile's order
    skipped: dict[str, str]  # variant name -> why this build cannot run it


def load_for_build(name_or_path: str | Path, variants: Iterable[str] | None = None,
                   binary: Path | None = None) -> ForThisBuild:
    """Load `name_or_path` once unchecked, drop the `variants` (default: all) its binary (or `binary`) cannot run
    (``not_runnable``), and load it again checked against the binary's --help unless one was dropped (then its
    options would fail the check): the one load sequence of asv's suite, `agreement` and `bisect`."""
    whole = load_profile(name_or_path, check_binary=False, binary=binary)
    names = list(variants) if variants is not None else [v.name for v in whole.variants]
    skipped = not_runnable(whole, names)
    profile = load_profile(whole.path, check_binary=not skipped, binary=binary)
    return ForThisBuild(profile, [name for name in names if name not in skipped], skipped)


def not_runnable(profile: Profile, variants: Iterable[str]) -> dict[str, str]:
    """The variants this build's llama-server cannot run (an older llama.cpp): why. It lacks an option the
    variant sets, or does not know the model's architecture.

    Over llama.cpp's history (the nightly, `agreement` on an older build) such a variant does not apply to that
    build (n/a), which is neither a failure nor a disagreement.
    """
    found = {}
    for name in variants:
        variant = profile.variant(name)
        architecture = gguf_check.architecture(variant.model)
        accepted = binaries.help_options(variant.binary)
        missing = [option for option in variant.options if option not in accepted]
        if binaries.knows_architecture(variant.binary, architecture) is False:
            found[name] = f"its llama-server does not know the model's architecture ({architecture})"
        elif missing:
            found[name] = f"its llama-server has no {', '.join(f'--{option}' for option in missing)}"
    return found
