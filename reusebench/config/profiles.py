"""Declarative YAML launch profiles: load, validate strictly, expand the matrix into variants.

A profile names the llama-server binary, the model (a path, `${ENV}` allowed, or a
generated `tiny:NAME` model), optional mmproj and LoRA adapters, and llama-server
options spelled as their long names. Everything is checked before a server
starts, and every error names the file and the field it comes from.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from reusebench.llama import binaries
from reusebench.config import options, sizes
from reusebench.config.options import OptionValue
from reusebench.llama.binaries import Binary, BinaryError
from reusebench.config.scenarios import SCENARIO_IDS  # one list: the catalogue's
from reusebench import reader
from reusebench.reader import Document

DEFAULT_N_PREDICT = 8
MMPROJ_AXIS = "mmproj"  # matrix axis that loads the profile's mmproj (true) or not (false)

# The harness owns these: it binds 127.0.0.1 on a free port and parses stderr at a fixed verbosity.
HARNESS_OWNED_OPTIONS: dict[str, str] = {
    "host": "the harness always binds 127.0.0.1",
    "port": "the harness picks a free port",
    "api-key": "the harness client sends no key",
    "api-key-file": "the harness client sends no key",
    "log-file": "the harness captures stderr itself",
    "log-disable": "the harness parses the server log",
    "verbosity": "the harness sets the log verbosity its parser needs",
    "log-verbosity": "the harness sets the log verbosity its parser needs",
    "verbose": "the harness sets the log verbosity its parser needs",
    "log-verbose": "the harness sets the log verbosity its parser needs",
}
# Options that have their own top-level key, so that paths are checked and the matrix can toggle them.
TOP_LEVEL_OPTIONS = frozenset({"model", "mmproj", "lora"})


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list", dict: "a mapping"}
_FIELD_TYPES: dict[str, type] = {
    "description": str,
    "extends": str,
    "binary": str,
    "model": str,
    "mmproj": str,
    "lora": list,
    "options": dict,
    "sizes": list,
    "scenarios": list,
    "verify": bool,
    "n_predict": int,
    "matrix": dict,
}


class ProfileError(ValueError):
    """An invalid profile; the message starts with "<file>: <field>:"."""


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

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        valid = ", ".join(variant.name for variant in self.variants)
        raise ProfileError(f"{_display(self.path)}: no variant {name!r}; valid variants: {valid}")


def default_profiles_dir() -> Path:
    """`$REUSEBENCH_PROFILES`, else the `server_profiles/` folder next to the package."""
    configured = os.environ.get("REUSEBENCH_PROFILES")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "server_profiles"


def profile_names(profiles_dir: Path | None = None) -> list[str]:
    return sorted(path.stem for path in (profiles_dir or default_profiles_dir()).glob("*.yaml"))


def load_profile(
    name_or_path: str | Path,
    profiles_dir: Path | None = None,
    check_binary: bool = True,
    scenario_ids: Sequence[str] = SCENARIO_IDS,
) -> Profile:
    """Load, validate and expand a profile given by name (in `profiles_dir`) or by path.

    With `check_binary`, every option name is checked against the binary's `--help`.
    Tiny models named by `tiny:` specs are generated if missing.
    """
    path, merged, origins = _read_merged(name_or_path, profiles_dir or default_profiles_dir(), scenario_ids)
    return _build(path, merged, origins, check_binary, scenario_ids)


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
    path = _locate(name_or_path, profiles_dir)
    chain = _read_chain(path, profiles_dir)
    layers = [(file, _check_layer(doc, scenario_ids)) for file, doc in chain]
    merged, origins = _merge(layers)
    return path, merged, _Origins(origins, path, {file: doc for file, doc in chain})


# --- reading ---------------------------------------------------------------------------------


def _locate(name_or_path: str | Path, profiles_dir: Path) -> Path:
    return reader.find(name_or_path, profiles_dir, ProfileError, "profile")


def profile_files(name_or_path: str | Path, profiles_dir: Path | None = None) -> list[Path]:
    """The profile's file and every file it extends, base first: what its content is made of."""
    profiles_dir = profiles_dir or default_profiles_dir()
    return [path for path, _ in _read_chain(_locate(name_or_path, profiles_dir), profiles_dir)]


def _read_chain(path: Path, profiles_dir: Path) -> list[tuple[Path, Document]]:
    """The profile and the profiles it extends, base first."""
    chain: list[tuple[Path, Document]] = []
    current: Path | None = path.resolve()
    while current is not None:
        if any(current == seen for seen, _ in chain):
            cycle = " -> ".join(_display(seen) for seen, _ in chain) + f" -> {_display(current)}"
            raise ProfileError(f"{chain[-1][1].at('extends')}: extends: cycle {cycle}")
        doc = _read_yaml(current)
        chain.append((current, doc))
        current = _parent_path(doc.data.get("extends"), doc, profiles_dir)
    return chain[::-1]


def _read_yaml(path: Path) -> Document:
    return reader.read(path, ProfileError, "profile", _display(path))


def _parent_path(extends: Any, doc: Document, profiles_dir: Path) -> Path | None:
    """The file `extends:` names. A path is taken from the child's directory. A name is a profile, as
    `--profile NAME` takes it: a file of that name beside the child wins (a user's own base), else the
    profile of that name in `profiles_dir` (the shipped ones), so a profile kept anywhere can extend tiny-base."""
    if extends is None:
        return None
    child, at = doc.path, doc.at("extends")
    if not isinstance(extends, str):
        raise ProfileError(f"{at}: extends: expected a string, got {_type_name(extends)}")
    if "/" in extends or extends.endswith((".yaml", ".yml")):
        parent = child.parent / extends
        if not parent.is_file():
            raise ProfileError(f"{at}: extends: {_display(parent)} does not exist")
        return parent.resolve()
    candidates = [child.parent / f"{extends}.yaml", profiles_dir / f"{extends}.yaml"]
    for parent in candidates:
        if parent.is_file():
            return parent.resolve()
    available = ", ".join(profile_names(profiles_dir)) or "none"
    raise ProfileError(f"{at}: extends: no profile {extends!r}: neither {_display(candidates[0])} "
                       f"nor {_display(candidates[1])} exists (profiles in {_display(profiles_dir)}: {available})")


# --- per-file checks (so an error names the file that holds the value) ---------------------------


def _check_layer(file: Document, scenario_ids: Sequence[str]) -> dict[str, Any]:
    """Check one file's fields and return them with sizes normalised to token counts."""
    layer: dict[str, Any] = {}
    for key, value in file.data.items():
        expected = _FIELD_TYPES.get(key) if isinstance(key, str) else None
        if expected is None:
            hint = reader.did_you_mean(str(key), _FIELD_TYPES)
            raise ProfileError(f"{file.at(key)}: {key}: unknown field{hint}; valid fields: {', '.join(_FIELD_TYPES)}")
        if value is not None:  # null unsets an inherited value
            _expect(value, expected, file, key)
        layer[key] = value
    if layer.get("lora") is not None:
        _check_items(layer["lora"], str, file, "lora")
    if layer.get("scenarios") is not None:
        _check_scenarios(layer["scenarios"], file, scenario_ids)
    if layer.get("sizes") is not None:
        layer["sizes"] = [_parse_size(size, file, f"sizes[{i}]") for i, size in enumerate(layer["sizes"])]
        if not layer["sizes"]:
            raise ProfileError(f"{file.at('sizes')}: sizes: needs at least one size")
    if layer.get("n_predict") is not None and layer["n_predict"] < 1:
        raise ProfileError(f"{file.at('n_predict')}: n_predict: must be at least 1, got {layer['n_predict']}")
    for name, value in (layer.get("options") or {}).items():
        _check_option_name(name, file, f"options.{name}")
        if value is not None:
            _check_option_value(value, file, f"options.{name}")
    for axis, values in (layer.get("matrix") or {}).items():
        _check_axis(axis, values, file)
    return layer


def _check_scenarios(scenarios: list[Any], file: Document, scenario_ids: Sequence[str]) -> None:
    _check_items(scenarios, str, file, "scenarios")
    for index, scenario in enumerate(scenarios):
        if scenario not in scenario_ids:
            hint = reader.did_you_mean(scenario, scenario_ids)
            raise ProfileError(
                f"{file.at(f'scenarios[{index}]')}: scenarios[{index}]: unknown scenario {scenario!r}{hint}; valid: {', '.join(scenario_ids)}"
            )
    if len(set(scenarios)) != len(scenarios):
        raise ProfileError(f"{file.at('scenarios')}: scenarios: lists a scenario twice")


def _check_axis(axis: Any, values: Any, file: Document) -> None:
    where = f"matrix.{axis}"
    if not isinstance(axis, str):
        raise ProfileError(f"{file.at(where)}: {where}: axis names must be strings")
    if axis != MMPROJ_AXIS:
        _check_option_name(axis, file, where)
    if not isinstance(values, list) or not values:
        raise ProfileError(f"{file.at(where)}: {where}: expected a non-empty list of values, got {values!r}")
    for index, value in enumerate(values):
        if axis == MMPROJ_AXIS:
            _expect(value, bool, file, f"{where}[{index}]")
        else:
            _check_option_value(value, file, f"{where}[{index}]")
    labels = [_label(value) for value in values]
    if len(set(labels)) != len(labels):
        raise ProfileError(f"{file.at(where)}: {where}: lists a value twice ({', '.join(labels)})")


def _check_option_name(name: Any, file: Document, where: str) -> None:
    if not isinstance(name, str) or name.startswith("-"):
        raise ProfileError(f"{file.at(where)}: {where}: write the option's long name without dashes (e.g. cache-reuse)")
    if name in HARNESS_OWNED_OPTIONS:
        raise ProfileError(f"{file.at(where)}: {where}: set by the harness, not by profiles ({HARNESS_OWNED_OPTIONS[name]})")
    if name in TOP_LEVEL_OPTIONS:
        raise ProfileError(f"{file.at(where)}: {where}: use the top-level field `{name}:` instead")


def _check_option_value(value: Any, file: Document, where: str) -> None:
    if isinstance(value, (list, dict)) or value is None:
        raise ProfileError(
            f"{file.at(where)}: {where}: expected a string, number or true/false, got {_type_name(value)} ({value!r})"
        )


def _check_items(items: list[Any], expected: type, file: Document, key: str) -> None:
    for index, item in enumerate(items):
        _expect(item, expected, file, f"{key}[{index}]")


def _expect(value: Any, expected: type, file: Document, where: str) -> None:
    # bool is a subclass of int in Python, but `n_predict: true` is still a mistake.
    matches = isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
    if not matches:
        raise ProfileError(f"{file.at(where)}: {where}: expected {_TYPE_NAMES[expected]}, got {_type_name(value)} ({value!r})")


def _parse_size(size: Any, file: Document, where: str) -> int:
    try:
        return sizes.parse_size(size)
    except sizes.SizeError as error:
        raise ProfileError(f"{file.at(where)}: {where}: {error}") from None


# --- merging and building ----------------------------------------------------------------------


def _merge(layers: list[tuple[Path, dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Path]]:
    """Deep-merge base-first layers (child wins, null unsets); remember which file set each field."""
    merged: dict[str, Any] = {}
    origins: dict[str, Path] = {}
    for path, layer in layers:
        for key, value in layer.items():
            if key == "extends":
                continue
            if key in ("options", "matrix") and value is not None:
                table = merged.setdefault(key, {})
                for name, entry in value.items():
                    _assign(table, name, entry)
                    origins[f"{key}.{name}"] = path
            else:
                _assign(merged, key, value)
                origins[key] = path
    return merged, origins


def _assign(table: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


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
    path: Path, merged: dict[str, Any], origins: _Origins, check_binary: bool, scenario_ids: Sequence[str]
) -> Profile:
    if "model" not in merged:
        raise ProfileError(f"{_display(path)}: model: required (set here or in the profile it extends)")
    with _reported_at(origins, "binary"):
        binary = binaries.resolve_binary(
            merged.get("binary"), source=origins.file("binary"), relative_to=origins.path("binary").parent
        )
    options = {
        name: _expand_value(value, origins, f"options.{name}") for name, value in merged.get("options", {}).items()
    }
    matrix: dict[str, list[OptionValue]] = merged.get("matrix", {})
    if check_binary:
        _check_against_help(binary, options, matrix, origins)
    mmproj = _resolve_file(merged["mmproj"], "mmproj", origins) if "mmproj" in merged else None
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
    return Profile(name=path.stem, path=path, description=merged.get("description", ""), variants=variants)


def _matrix_points(matrix: dict[str, list[OptionValue]]) -> list[tuple[tuple[str, OptionValue], ...]]:
    """Every combination of axis values, in file order; one empty point when there is no matrix."""
    axes = [[(axis, value) for value in values] for axis, values in matrix.items()]
    return list(itertools.product(*axes))


def _variant_name(point: tuple[tuple[str, OptionValue], ...]) -> str:
    """"mmproj=on,cache-reuse=256"; "default" without a matrix."""
    return ",".join(f"{axis}={_label(value)}" for axis, value in point) or "default"


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


def _resolve_file(spec: str, where: str, origins: _Origins) -> Path:
    """A model, mmproj or LoRA file (by `where`): `tiny:NAME` (generated if missing) or an existing path."""
    with _reported_at(origins, where):
        from reusebench import tiny  # imported lazily: it pulls in numpy and gguf

        if tiny.is_tiny_spec(spec):
            name = spec.removeprefix(tiny.SPEC_PREFIX)
            if where == "model":
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


# --- small helpers ---------------------------------------------------------------------------


def _label(value: OptionValue) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


_type_name = reader.type_name
_display = reader.display
