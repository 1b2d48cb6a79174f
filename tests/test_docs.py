"""The docs' figures have one source: every time a page gives in minutes is a row of docs/measured.md, which is
rendered from docs/measured.json; what a program printed (code) is quoted, not measured, and is left alone."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

from conftest import load_tool

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md",
         REPO / "workloads" / "README.md", REPO / "results" / "README.md", REPO / "Makefile"]
DURATION = re.compile(r"\b\d+\s+min(?:\s+\d+\s+s)?\b")  # "5 min\n48 s" too: a line break is a space


def measured_tool():
    return load_tool("measured")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code: what the page itself states."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"^    .*$", "", text, flags=re.M)  # indented code blocks
    return re.sub(r"`[^`\n]*`", "", text)


def test_measured_md_is_rendered_from_its_json() -> None:
    tool = measured_tool()
    entries = json.loads((REPO / "docs" / "measured.json").read_text())
    assert (REPO / "docs" / "measured.md").read_text() == tool.render(entries)
    assert len({e["id"] for e in entries}) == len(entries)
    assert tool.duration(384) == "6 min 24 s (384 s)" and tool.duration(14) == "14 s"


def test_every_time_in_minutes_on_a_page_is_a_measured_row() -> None:
    tool = measured_tool()
    known = {tool.duration(e["seconds"]).split(" (")[0] for e in json.loads((REPO / "docs" / "measured.json").read_text())}
    stated = {(page.relative_to(REPO).as_posix(), found) for page in PAGES if page.name != "measured.md"
              for found in (" ".join(d.split()) for d in DURATION.findall(prose(page.read_text())))}
    assert {(page, found) for page, found in stated if found not in known} == set()
    assert stated  # the pages do quote it


# a module path in a page's inline code: reusebench's own subpackages, optionally written with "reusebench."
LAYERS = ("records", "reader", "machine", "llama", "tiny", "real", "capability", "config", "reuse", "trace", "run",
          "whatif", "fuzz", "tap", "check", "advise", "report", "bisect", "nightly", "cli", "budget", "listening")
MODULE_PATH = re.compile(r"(?<![\w./-])(?:reusebench\.)?((?:" + "|".join(LAYERS) + r")(?:\.[A-Za-z_]\w*)+)")
FILE_NAME = re.compile(r"\.(json|jsonl|md|py|html|ya?ml|log|txt|gguf|toml|sh|diff|cpp)$")


def resolves(dotted: str) -> bool:
    """`dotted` names a module of reusebench, or something in one (a class, a function, a constant, a method)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module("reusebench." + ".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_module_path_a_page_names_exists() -> None:
    named = {(page.name, m.group(1)) for page in PAGES for code in re.findall(r"`([^`\n]*)`", page.read_text())
             for m in MODULE_PATH.finditer(code)
             if m.group(1) != "llama.cpp" and not FILE_NAME.search(m.group(1))}
    assert len(named) > 50  # the pages name the code they describe
    assert not sorted(f"{page}: {dotted}" for page, dotted in named if not resolves(dotted))
