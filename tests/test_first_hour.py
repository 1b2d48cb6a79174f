"""A user's first hour: every bad input named, with its file, line and field or both numbers, before any server
starts, and a plan that comes at once (the reuse model's cost grows with the tokens, not their square)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from reusebench import check
from reusebench.check import run as check_run
from reusebench.cli import main
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
