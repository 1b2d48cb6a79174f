"""A user's first hour: every bad input named, with its file, line and field or both numbers, before any server
starts, and a plan that comes at once (the reuse model's cost grows with the tokens, not their square)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from reusebench import check, tiny
from reusebench.check import run as check_run
from reusebench.cli import main
from reusebench.config import profiles
from reusebench.llama.outputs import common_prefix, shared_run

from conftest import child_llama_servers

pytestmark = pytest.mark.e2e


def profile(tmp_path: Path, body: str) -> str:
    path = tmp_path / "mine.yaml"
    path.write_text(body)
    return str(path)


def test_a_value_with_a_unit_names_file_line_and_field_also_in_a_dry_run(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = profile(tmp_path, "description: mine\nextends: tiny-base\noptions:\n  cache-ram: 4GB\n")
    for extra in ([], ["--dry-run"]):
        assert main(["run", "--profile", path, "--size", "2K", *extra]) == 3
        err = capsys.readouterr().err.strip()
        # the option sits on line 4, column 3
        assert err.startswith(f"reusebench run: {path}:4:3: options.cache-ram: --cache-ram takes an integer (N in "
                              "--help), not '4GB'")


def test_a_size_beyond_the_trained_context_is_refused_with_both_numbers_before_any_server(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = child_llama_servers()
    for extra in ([], ["--dry-run"]):
        assert main(["run", "--profile", "gemma3-270m", "--size", "64K", *extra]) == 3
        err = capsys.readouterr().err
        # 64K is 65,536 tokens and 8 are generated: the size alone is past Gemma's 32,768
        assert ("at 64K: its longest prompt and output take 65,544 tokens, beyond gemma-3-270m-q4_k_m.gguf's trained "
                "context of 32,768") in err
        assert child_llama_servers() == before


def test_a_size_past_the_profile_s_ctx_size_is_refused_with_both_numbers(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = profile(tmp_path, "description: mine\nextends: tiny-base\noptions:\n  ctx-size: 4096\n")
    assert main(["run", "--profile", path, "--size", "8K", "--dry-run"]) == 3
    # one slot: its context is the whole 4,096
    assert "take 8,200 tokens, beyond the 4,096 of a slot that options.ctx-size 4096 gives" in capsys.readouterr().err


def test_a_run_of_shared_ids_is_found_without_reading_past_its_end() -> None:
    a, b = tuple(range(100_000)), [7, 8, 9, 5]
    assert shared_run(a, 7, b, 0) == 3 and shared_run(a, 6, b, 0) == 0 and shared_run(a, 7, b, 4) == 0
    assert common_prefix(a, list(a)) == 100_000 and common_prefix(a, [*a[:70_000], -1]) == 70_000


# -- check: chosen options, a table that fits, Ctrl-C that keeps what was reached -------------------------------


def test_check_takes_only_the_options_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--profile", "tiny-llama", "--option", "cache-ram", "--option", "ctx-checkpoints",
                 "--results", str(tmp_path), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert [v["option"] for v in report["verdicts"]] == ["ctx-checkpoints", "cache-ram"]  # in probe order


def test_check_of_an_option_the_variant_does_not_check_names_those_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--profile", "tiny-llama", "--option", "cache-rams"]) == 2
    err = capsys.readouterr().err
    assert "--option cache-rams: not among the options this variant checks (" in err and "cache-ram," in err


def test_the_check_table_fits_100_columns_and_wide_shows_it_whole(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for wide, fits in (([], True), (["--wide"], False)):
        assert main(["check", "--profile", "tiny-llama", "--option", "cache-ram", "--results", str(tmp_path),
                     *wide]) == 0
        widest = max(len(line) for line in capsys.readouterr().out.splitlines())
        assert (widest <= 100) is fits, widest


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_check_stopped_mid_probe_keeps_its_verdicts_marked_incomplete_and_exits_130(
        signum: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A real signal to this process as the second probe starts: the first verdict is kept, the rest say why not."""
    probes: list[str] = []
    real_probe = check_run._run_probe

    def second_is_stopped(ctx, setting, probe):  # type: ignore[no-untyped-def]
        probes.append(setting.option)
        if len(probes) == 2:
            os.kill(os.getpid(), signum)
        return real_probe(ctx, setting, probe)

    monkeypatch.setattr(check_run, "_run_probe", second_is_stopped)
    before = child_llama_servers()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background `make test &` ignores it
    try:
        status = main(["check", "--profile", "tiny-llama", "--option", "cache-ram", "--option", "ctx-checkpoints",
                       "--results", str(tmp_path)])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert status == 130
    assert child_llama_servers() == before  # every server it started is stopped
    (kept,) = tmp_path.glob("runs/*/check.json")
    (report,) = json.loads(kept.read_text())
    assert report["incomplete"] == check.INTERRUPTED
    first, second = report["verdicts"]
    # reached: the control's attention memory needs no checkpoint, so the option does nothing there
    assert first["option"] == "ctx-checkpoints" and first["verdict"] == "INEFFECTIVE"
    assert (second["option"], second["verdict"], second["evidence"]) == ("cache-ram", "UNVERIFIED", [check.INTERRUPTED])
    assert "marked incomplete" in capsys.readouterr().err
    assert "INCOMPLETE" in (kept.parent / "index.html").read_text()


# -- what a person reads: tables that fit, what was cut or unjudged said plainly -------------------------------


SWA_STEPS = ["--scenario", "interleave", "--scenario", "reask", "--scenario", "restore_disk"]


def test_a_run_prints_tables_that_fit_100_columns_and_says_the_wrong_output_it_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-gemma3 with --swa-full: a window with a hole after a RAM or slot-file round trip, predicted wrong
    assert main(["run", "--profile", "tiny-gemma3", "--variant", "swa-full=on", "--size", "2K", *SWA_STEPS,
                 "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert max(len(line) for line in captured.out.splitlines()) <= 100
    # progress lines wrap at 100 columns too, each continuation indented; only a path longer than that stays whole
    assert all(len(line) <= 100 or len(line.split()) == 1 for line in captured.err.splitlines())
    progress = " ".join(captured.err.split())
    assert "corpus tiny-words" in progress  # the run says which corpus its documents come from
    assert "interleave/back to first: re-processed 1 of 2,069 (ideal 1, expected 1) in " in progress
    assert "[hit; wrong output predicted]" in progress  # judged later, from its reference: WRONG
    said = " ".join(captured.out.split())  # lines wrap at 100 columns
    assert "wrong output predicted by the reuse model: 5 (interleave/back to first (measured: WRONG)" in said
    (run_dir,) = tmp_path.glob("runs/*/")
    page = (run_dir / "index.html").read_text()
    assert "wrong output predicted by the reuse model: 5" in page
    # the page lists the launch options as the profile wrote them, the build and the corpus
    assert "--swa-full" in page and "--ubatch-size 512" in page and "corpus: tiny-words" in page
    assert "report.md" and "| scenario" in (run_dir / "report.md").read_text()  # the file keeps every column
    assert main(["report", str(run_dir), "--wide"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) > 100


def test_a_run_without_verification_says_which_reused_outputs_it_left_unjudged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--profile", "tiny-llama", "--size", "2K", "--scenario", "resend", "--scenario", "reask",
                 "--no-verify", "--results", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["unverified"]) for r in rows] == [("cold", False), ("same prompt", True),
                                                            ("new question", True)]
    assert main(["report", "--results", str(tmp_path)]) == 0
    said = " ".join(capsys.readouterr().out.split())  # the line wraps at 100 columns
    assert ("UNVERIFIED: 2 reused output(s) not judged against a no-reuse reference (resend/same prompt, "
            "reask/new question)") in said


def test_a_real_model_reads_real_prose_unless_its_profile_names_a_corpus(tmp_path: Path) -> None:
    mine = profile(tmp_path, "description: mine\nmodel: real:gemma3-270m\n")
    assert profiles.load_profile(mine).corpus == "python-docs"
    assert profiles.load_profile("tiny-llama").corpus == "tiny-words"


def test_the_complete_profile_in_the_docs_loads_with_a_model_put_in_its_place(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "profiles.md").read_text()
    (block,) = re.findall(r"```yaml\n(# my-model.yaml.*?)```", text, flags=re.S)
    model = tmp_path / "my-model-Q4_K_M.gguf"
    shutil.copy(tiny.model_path("llama"), model)
    path = tmp_path / "my-model.yaml"
    path.write_text(block.replace("~/models/my-model-Q4_K_M.gguf", str(model)))  # every option on its --help
    loaded = profiles.load_profile(str(path))
    assert [v.name for v in loaded.variants] == ["cache-ram=0", "cache-ram=8192"] and loaded.corpus == "python-docs"
