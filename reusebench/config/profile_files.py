"""A profile's files: reading each (``reader``), the checks of each file's fields (so an error names the file that
holds the value), the chain of files it extends, and merging them base first."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reusebench import reader
from reusebench.config import sizes
from reusebench.config.options import OptionValue
from reusebench.reader import Document

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
    "corpus": str,
    "matrix": dict,
}


class ProfileError(ValueError):
    """An invalid profile; the message starts with "<file>: <field>:"."""


def default_profiles_dir() -> Path:
    """`$REUSEBENCH_PROFILES`, else the `server_profiles/` folder next to the package."""
    configured = os.environ.get("REUSEBENCH_PROFILES")
    return Path(configured) if configured else Path(__file__).resolve().parents[2] / "server_profiles"


def profile_names(profiles_dir: Path | None = None) -> list[str]:
    return sorted(path.stem for path in (profiles_dir or default_profiles_dir()).glob("*.yaml"))


# --- reading ---------------------------------------------------------------------------------


def locate(name_or_path: str | Path, profiles_dir: Path) -> Path:
    return reader.find(name_or_path, profiles_dir, ProfileError, "profile")


def read_chain(path: Path, profiles_dir: Path) -> list[tuple[Path, Document]]:
    """The profile and the profiles it extends, base first."""
    chain: list[tuple[Path, Document]] = []
    current: Path | None = path.resolve()
    while current is not None:
        if any(current == seen for seen, _ in chain):
            cycle = " -> ".join(_display(seen) for seen, _ in chain) + f" -> {_display(current)}"
            raise ProfileError(f"{chain[-1][1].at('extends')}: extends: cycle {cycle}")
        doc = read_yaml(current)
        chain.append((current, doc))
        current = parent_path(doc.data.get("extends"), doc, profiles_dir)
    return chain[::-1]


def read_yaml(path: Path) -> Document:
    return reader.read(path, ProfileError, "profile", _display(path))


def parent_path(extends: Any, doc: Document, profiles_dir: Path) -> Path | None:
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


def check_layer(file: Document, scenario_ids: Sequence[str]) -> dict[str, Any]:
    """Check one file's fields and return them with sizes normalised to token counts."""
    layer: dict[str, Any] = {}
    for key, value in file.data.items():
        expected = _FIELD_TYPES.get(key) if isinstance(key, str) else None
        if expected is None:
            # a name that is no field's misspelling is most often a llama-server option written at the top level
            name = reader.shown(key)
            hint = reader.did_you_mean(str(key), _FIELD_TYPES) or (
                f"; a llama-server option goes under `options:` (options: {{{name}: {reader.shown(value)}}})")
            raise ProfileError(f"{file.at(key)}: {name}: unknown field{hint}; valid fields: {', '.join(_FIELD_TYPES)}")
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
    labels = [label(value) for value in values]
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


# --- merging ---------------------------------------------------------------------------------


def merge(layers: list[tuple[Path, dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Path]]:
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


# --- small helpers ---------------------------------------------------------------------------


def label(value: OptionValue) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


_type_name = reader.type_name
_display = reader.display
