"""One rule of the world changed behind the reuse model's back, on the real server: the outcome flips.

The profile still says 32 context checkpoints, but its binary is a launcher that appends `--ctx-checkpoints 0`
(last flag wins), as the asv nightly's stand-in commit does. The model, told only the profile, expects the re-ask
to go back to the checkpoint 4 + n_ubatch tokens before the end; the server re-processes the whole prompt. The
record says UNEXPECTED with both causes, and the report shows expected beside measured.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reusebench.config import profiles
from reusebench.records import Record, Role
from reusebench.report import run_report as report
from reusebench.run import runner
from reusebench.run.selection import Selection

from conftest import default_llama_server

SIZE = 2048


def hybrid_profile(directory: Path, extra_args: str) -> Path:
    launcher = directory / "llama-server"
    launcher.write_text(f'#!/bin/sh\nexec "{default_llama_server()}" "$@" {extra_args}\n')
    launcher.chmod(0o755)
    path = directory / "hybrid.yaml"
    path.write_text(f"extends: tiny-granitehybrid\nbinary: {launcher}\n")
    return path


def reask(directory: Path, extra_args: str) -> tuple[Record, str]:
    profile = profiles.load_profile(hybrid_profile(directory, extra_args))
    result = runner.run_profile(profile, Selection(sizes=(SIZE,), scenario_ids=("reask",)),
                                results_dir=directory / "results", out=io.StringIO())
    (measured,) = [r for r in result.records if r.role == Role.MEASURE and r.scenario == "reask"]
    return measured, report.render_text(result.records)


@pytest.mark.e2e
def test_checkpoints_disabled_behind_the_models_back_make_the_reask_unexpected(tmp_path: Path) -> None:
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    kept, _ = reask(tmp_path / "on", "")
    lost, text = reask(tmp_path / "off", "--ctx-checkpoints 0")
    assert kept.verdict == "partial" and kept.prompt_n == kept.expected == 515
    assert lost.verdict == "UNEXPECTED" and lost.expected == 515
    assert lost.prompt_n == lost.prompt_tokens  # the whole prompt
    assert lost.cause_expected == f"restored checkpoint at n_tokens={lost.prompt_tokens - 515}"
    assert lost.cause["summary"] == "forced full re-processing (no checkpoint before divergence)"
    assert f"| {lost.prompt_n:,} / 17" in text and f"| 515 (+{lost.prompt_n - 515:,})" in text
    assert "steps the reuse model did not expect: 1 (reask/new question)" in text
