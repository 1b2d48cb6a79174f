"""The one strict reader of the project's YAML files (server profiles, workloads, corpora) and the words of its
errors: every error starts with "<file>:<line>:<column>: <field>:", ``${ENV}`` references expand, and a
misspelt name gets a did-you-mean.

The dialect: YAML 1.2 booleans and no duplicate keys. Plain YAML 1.1 reads `flash-attn: on` as
`flash-attn: true`; here `on`, `off`, `yes` and `no` stay strings, so option values reach llama-server as
written.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class StrictLoader(yaml.SafeLoader):
    """YAML 1.2 booleans and no duplicate keys."""


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _construct_unique_mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def shown(text: object) -> str:
    """A name from a file as an error message shows it: as it is, or quoted with escapes where it holds a line
    break or another control character (an error message stays one line)."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def display(path: Path) -> str:
    """A path relative to the working directory when it is below it, else absolute."""
    absolute = path.resolve()
    with contextlib.suppress(ValueError):
        return str(absolute.relative_to(Path.cwd()))
    return str(absolute)


@dataclass(frozen=True)
class Document:
    """One file's top-level mapping, and where each field sits ("options.cache-reuse", "users[0].lora")."""

    path: Path
    name: str  # the file as errors name it
    data: dict[str, Any]
    marks: dict[str, tuple[int, int]]  # field -> (line, column), from 1

    def at(self, field: str = "") -> str:
        """"<file>:<line>:<column>" of `field`, or of the nearest enclosing field it sits in (the file's start
        for a field it lacks)."""
        while field and field not in self.marks:
            field = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", field) if re.search(r"[.\[]", field) else ""
        line, column = self.marks.get(field, (1, 1))
        return f"{self.name}:{line}:{column}"


def _marks(node: yaml.Node, prefix: str, found: dict[str, tuple[int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            field = f"{prefix}.{key.value}" if prefix else str(key.value)
            found.setdefault(field, (key.start_mark.line + 1, key.start_mark.column + 1))
            _marks(value, field, found)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            field = f"{prefix}[{index}]"
            found.setdefault(field, (item.start_mark.line + 1, item.start_mark.column + 1))
            _marks(item, field, found)


def read(path: Path, error: type[Exception], kind: str, name: str | None = None) -> Document:
    """Read one YAML file of `kind` ("profile", "workload", "corpus"); bad YAML or a top level that is no
    mapping raises `error` with the line and column."""
    name = name or str(path)
    loader = StrictLoader(path.read_text())
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else f"{name}:1:1"
        raise error(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise error(f"{name}:1:1: expected a mapping of {kind} fields, got {type_name(data)}")
    marks: dict[str, tuple[int, int]] = {}
    _marks(node, "", marks)
    return Document(path, name, data, marks)


def find(name_or_path: str | Path, directory: Path, error: type[Exception], kind: str) -> Path:
    """A file given by path, or by name in `directory` ("tiny-llama" -> directory/tiny-llama.yaml). One that is not
    there raises `error` marked ``not_there`` (what the command line names is missing, not a wrong file), with the
    closest name."""
    text = str(name_or_path)
    looks_like_path = isinstance(name_or_path, Path) or "/" in text or text.endswith((".yaml", ".yml"))
    path = Path(text).expanduser() if looks_like_path else directory / f"{text}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in directory.glob("*.yaml"))
        close = difflib.get_close_matches(path.stem, names, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        missing = error(f"{display(path)}: no such {kind} ({hint}{kind}s in {display(directory)}: "
                        f"{', '.join(names) or 'none'})")
        missing.not_there = True  # type: ignore[attr-defined]
        raise missing
    return path


def expand_env(value: str, *, source: str, field_name: str, error: type[Exception] = ValueError) -> str:
    """Expand `${VAR}` and `${VAR:-fallback}`; an unset variable without fallback raises `error`."""

    def substitute(match: re.Match[str]) -> str:
        name, fallback = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if fallback is not None:
            return fallback
        raise error(f"{source}: {field_name}: environment variable {name} is not set")

    return _ENV_REFERENCE.sub(substitute, value)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """A hint naming the closest candidate, " (did you mean 'x'?)", or "" when none is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def type_name(value: Any) -> str:
    return {type(None): "null", dict: "a mapping", list: "a list", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )
