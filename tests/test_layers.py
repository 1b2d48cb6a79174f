"""The library's layers: each subpackage imports only those below it, so the imports run one way with no cycle.

Read from the source with ``ast`` (every import, also inside functions), not from what happens to be loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

import reusebench

PACKAGE = Path(reusebench.__file__).parent
# bottom to top; a layer may import itself and the layers before it, never one after it
LAYERS = ("records", "reader", "machine", "llama", "tiny", "real", "capability", "config", "reuse", "trace", "run", "whatif", "fuzz", "tap", "check", "advise",
          "report", "bisect", "nightly", "cli")
TOP = {"__init__": "records", "__main__": "cli", "listening": "records", "budget": "records"}  # the package's own files: what they may reach


def layer_of(module: str) -> str:
    """The layer of "reusebench.llama.client" (llama) or "reusebench.records" (records)."""
    first = module.split(".")[1]
    return TOP.get(first, first)


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The reusebench modules a source file imports (``from reusebench.run import session`` names the module
    reusebench.run.session, ``from reusebench.records import Record`` the module reusebench.records)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("reusebench"):
            for a in node.names:
                inner = package.parent.joinpath(*f"{node.module}.{a.name}".split("."))
                is_module = inner.with_suffix(".py").is_file() or (inner / "__init__.py").is_file()
                found.add(f"{node.module}.{a.name}" if is_module else str(node.module))
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reusebench.")}
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}: a relative import; the layer check reads absolute ones")
    return found


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def back_imports(package: Path = PACKAGE) -> list[str]:
    wrong = []
    for path in sorted(package.rglob("*.py")):
        name = module_name(path, package)
        here = LAYERS.index(layer_of(name)) if name != "reusebench" else 0
        for imported in sorted(imports(path, package)):
            there = LAYERS.index(layer_of(imported))
            if there > here:
                wrong.append(f"{name} ({LAYERS[here]}) imports {imported} ({LAYERS[there]})")
    return wrong


def test_every_file_belongs_to_a_layer() -> None:
    names = {module_name(p) for p in PACKAGE.rglob("*.py")} - {"reusebench"}
    assert {layer_of(n) for n in names} <= set(LAYERS), sorted(n for n in names if layer_of(n) not in LAYERS)


def test_imports_run_one_way_down_the_layers() -> None:
    assert back_imports() == []


def test_the_check_sees_a_back_import(tmp_path: Path) -> None:
    """A package laid out the same way whose llama layer reaches up into run: the one back import is reported."""
    package = tmp_path / "reusebench"
    for name, source in {"__init__": "", "records": "", "llama/__init__": "", "run/__init__": "",
                         "run/session": "from reusebench.llama import client\n",
                         "llama/client": "from reusebench.run import session\nfrom reusebench import records\n"}.items():
        (package / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (package / f"{name}.py").write_text(source)
    assert imports(package / "llama" / "client.py", package) == {"reusebench.run.session", "reusebench.records"}
    assert back_imports(package) == ["reusebench.llama.client (llama) imports reusebench.run.session (run)"]


def test_no_module_imports_itself_in_a_cycle() -> None:
    """Within a layer too: the module graph has no cycle (depth-first search for a back edge)."""
    graph = {module_name(p): {m for m in imports(p)} for p in PACKAGE.rglob("*.py")}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]) if nxt in trail else nxt)
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_module_is_over_450_lines() -> None:
    # a module with one job fits in 450 lines; past that it holds two (docs/architecture.md)
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 450}
    assert long == {}
