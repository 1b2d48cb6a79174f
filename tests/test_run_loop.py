"""One run loop and one opening for every driver, and a run's kind read in one place."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import reusebench
from reusebench.records import RecordWriter, RunKind
from reusebench.report import run_kinds, run_report
from reusebench.run import provenance
from test_records import record

PACKAGE = Path(reusebench.__file__).parent
# what opens a run and what ends a server's run; where each may be called
LIFECYCLE = {"create": "run/opening.py", "RecordWriter": "run/opening.py", "keep_log": "run/loop.py",
             "learn_build": "run/loop.py"}


def calls(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return found


def test_no_driver_opens_a_run_or_ends_a_server_s_run_outside_the_loop() -> None:
    """Every command and asv benchmark opens its run through ``run.opening`` and runs its server through
    ``run.loop``."""
    misplaced = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "benchmarks").rglob("*.py")]):
        where = str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else str(path)
        for name in calls(path) & LIFECYCLE.keys():
            if where != LIFECYCLE[name]:
                misplaced.append(f"{where} calls {name}")
    assert not misplaced


def write(run_dir: Path, rs: list, kind: str | None = None) -> Path:
    run_dir.mkdir(parents=True)
    with RecordWriter(run_dir / "records.jsonl") as writer:
        for r in rs:
            writer.write(r)
    if kind is not None:
        (run_dir / provenance.STAMP_FILE).write_text(json.dumps(
            {"reusebench_commit": None, "reusebench_dirty": None, "profile": "", "profile_sha256": "",
             "binaries": {}, "kind": kind}))
    return run_dir


def test_run_json_names_the_kind_the_records_would_be_guessed_as_otherwise(tmp_path: Path) -> None:
    # a workload's records name their users; its run.json says it was a tap's: the run.json decides
    tapped = write(tmp_path / "tap", [record("chat", "turn 1", user="u1")], kind="tap")
    assert run_kinds.of_run(tapped) is RunKind.TAP


@pytest.mark.parametrize(("rs", "kind"), [
    ([record("replay", "line 1", user="trace")], RunKind.REPLAY),
    ([record("chat", "turn 1", user="u1")], RunKind.WORKLOAD),
    ([record("first_load", "cold")], RunKind.SCENARIOS),
], ids=["replay", "workload", "scenarios"])
def test_a_run_from_before_kinds_were_kept_is_read_by_its_records(tmp_path: Path, rs: list, kind: RunKind) -> None:
    assert run_kinds.of_run(write(tmp_path / "old", rs)) is kind


def test_a_run_from_before_kinds_were_kept_with_no_records_is_read_by_its_file(tmp_path: Path) -> None:
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / run_kinds.CHECK_FILE).write_text("[]")
    assert run_kinds.of_run(tmp_path / "check") is RunKind.CHECK


def test_the_report_titles_each_run_by_its_kind(tmp_path: Path) -> None:
    rs = [record("chat", "turn 1", user="u1", run_id="t1"), record("first_load", "cold", run_id="s1")]
    text = run_report.render_text(rs, kinds={"t1": RunKind.TAP})
    assert "## tap run t1" in text and "## workload run" not in text
