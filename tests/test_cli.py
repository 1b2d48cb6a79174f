"""The command line's conventions, as asv's and pytest's: --version, a description on every command, the exit
statuses in --help, -q and -v, --json where there are results, one way to name a profile and to repeat a choice."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
from pathlib import Path

import pytest

from reusebench import cli
from reusebench.cli import common, exits
from reusebench.llama import builder
from reusebench.run import progress, provenance

REPO = Path(__file__).resolve().parents[1]


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_version_names_the_package_and_the_pinned_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == (f"reusebench 0.1.0 (llama-server default: llama.cpp "
                                               f"b{builder.PINNED.build_number}, {builder.PINNED.requirement})")


def test_every_command_has_a_description_its_exit_statuses_in_short_and_q_v() -> None:
    found = commands()
    assert len(found) == 21  # replay and whatif are the 18th and 19th, bisect the 20th, fuzz the 21st
    for name, parser in found.items():
        text = parser.format_help()
        assert parser.description and len(parser.description) > 30, name
        # the statuses in two lines, pointing at the whole table, which only the top-level --help prints
        assert exits.short() in text and exits.table() not in text and common.ENVIRONMENT_DOC in text, name
        assert "-q, --quiet" in text and "-v, --verbose" in text, name
    assert exits.table() in cli.build_parser().format_help()
    assert all(f"{code.value} " in exits.short() for code in exits.Exit)


def test_the_exit_table_keeps_config_errors_apart_from_usage_errors() -> None:
    assert [(code.name, code.value) for code in exits.Exit] == [
        ("OK", 0), ("FINDING", 1), ("USAGE", 2), ("CONFIG", 3), ("BUSY", 4), ("INTERRUPTED", 130)]
    assert set(exits.MEANING) == set(exits.Exit)
    documented = re.findall(r"^\| (\d+) \| (.+) \|$", (REPO / "docs" / "commands.md").read_text(), re.M)
    assert [(int(code), text.replace("`", "")) for code, text in documented] == [
        (code.value, exits.MEANING[code]) for code in exits.Exit]  # the docs' table is --help's


@pytest.mark.parametrize("command", ["run", "check", "advise", "workload", "agreement"])
def test_a_profile_is_named_by_profile_everywhere(command: str) -> None:
    options = {o for action in commands()[command]._actions for o in action.option_strings}
    assert "--profile" in options
    positional = [a.dest for a in commands()[command]._actions if not a.option_strings]
    assert "profile" not in positional


def test_a_choice_is_repeated_not_listed(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["run", "--profile", "p", "--scenario", "reask", "--scenario", "resend",
                                          "--size", "2K", "--size", "4K"])
    assert (args.scenario, args.size) == (["reask", "resend"], [2048, 4096])
    assert capsys.readouterr().err == ""  # the old list form works with a note (tests/test_doc_commands.py)


@pytest.mark.parametrize("command", ["run", "workload", "profiles", "check", "probe", "report", "compare", "inspect"])
def test_json_is_on_every_command_with_results(command: str) -> None:
    assert "--json" in {o for action in commands()[command]._actions for o in action.option_strings}


def test_profiles_json_lists_each_profile_with_its_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profiles", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert set(listed["tiny-qwen35"]["variants"]) == {f"mmproj={m},cache-reuse={c}" for m in ("on", "off")
                                                      for c in ("0", "256")}
    assert {"cache-reuse", "mmproj"} <= set(listed["tiny-qwen35"]["variants"]["mmproj=on,cache-reuse=256"])
    assert "mmproj" not in listed["tiny-qwen35"]["variants"]["mmproj=off,cache-reuse=256"]


def test_q_silences_the_progress_and_keeps_the_results(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["profiles"]) == 0
    said = capsys.readouterr()
    assert "use one with `reusebench run --profile NAME`" in said.err
    assert cli.main(["profiles", "-q"]) == 0
    assert capsys.readouterr() == (said.out, "")


@pytest.mark.e2e
def test_v_shows_each_llama_server_start_and_stop(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("reusebench")
    try:
        assert cli.main(["check", "-v", "--profile", "tiny-llama", "--results", str(tmp_path)]) == 0
    finally:
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
    err = capsys.readouterr().err
    started = [line for line in err.splitlines() if line.startswith("reusebench.llama.process: started llama-server")]
    stopped = [line for line in err.splitlines() if line.startswith("reusebench.llama.process: stopped llama-server")]
    assert started and len(started) == len(stopped)
    assert "--api-key" not in err  # the key it generated stays out of what it shows
    (run,) = (tmp_path / "runs").iterdir()
    assert provenance.read(run).kind == "check" and (run / "check.json").is_file()


def test_a_config_error_exits_3_naming_the_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "p.yaml"
    broken.write_text("n_predict: eight\n")
    assert cli.main(["run", "--profile", str(broken), "--dry-run"]) == exits.Exit.CONFIG
    assert capsys.readouterr().err.startswith(f"reusebench run: {broken}:1:1: n_predict: expected an integer")


def test_a_mistyped_flag_is_refused_by_its_command_with_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["run", "--profile", "tiny-llama", "--szie", "8K"])
    err = capsys.readouterr().err
    assert refused.value.code == exits.Exit.USAGE
    assert err.startswith("usage: reusebench run ")  # the command's usage, not the whole program's
    assert err.rstrip().endswith("unrecognized arguments: --szie 8K (--szie: did you mean --size?)")


def test_a_profile_the_command_line_names_that_is_not_there_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    # exit 2, as documented: "what it names is not there"; 3 is for a file that is there and wrong
    assert cli.main(["run", "--profile", "tiny-lama", "--size", "8K"]) == exits.Exit.USAGE
    assert "tiny-lama.yaml: no such profile (did you mean tiny-llama? " in capsys.readouterr().err


def test_every_command_names_a_variant_the_same_way() -> None:
    shown = {name: [a.metavar for a in command._actions if "--variant" in a.option_strings]
             for name, command in next(a for a in cli.build_parser()._actions
                                       if isinstance(a, argparse._SubParsersAction)).choices.items()}
    assert {metavar for found in shown.values() for metavar in found} == {"NAME"}


def test_a_negative_size_is_named_by_the_size_s_own_check(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse alone reads "-8K" as an option and says only "expected one argument"
    with pytest.raises(SystemExit):
        cli.main(["run", "--profile", "tiny-llama", "--size", "-8K"])
    assert capsys.readouterr().err.rstrip().endswith(
        "argument --size: expected a positive token count such as 2048, 32K or 1M, got '-8K'")


def test_progress_lines_fit_the_terminal_with_paths_whole_and_live_lines_untouched() -> None:
    to = io.StringIO()
    out = progress.fitted(to, 40)
    step = "[s]   resend/same prompt: re-processed 1 of 8,211 (ideal 1, expected 1) in 2.04 s"  # 83 columns
    print(step, file=out)
    print("records -> /tmp/a/very/long/run/directory/records.jsonl", file=out)
    out.write("\r  resend: prefill  50.0%")  # the live line on a tty: written at once, as it is
    out.flush()
    print("\r\033[K[s] done", file=out)
    lines = to.getvalue().split("\n")
    assert lines[:3] == ["[s]   resend/same prompt: re-processed 1",
                         "    of 8,211 (ideal 1, expected 1) in",  # the line's own indent (none), and four more
                         "    2.04 s"]
    assert lines[3:5] == ["records ->", "    /tmp/a/very/long/run/directory/records.jsonl"]  # 48 columns, whole
    assert lines[5] == "\r  resend: prefill  50.0%\r\033[K[s] done"
    assert " ".join(to.getvalue().split()).count("re-processed 1 of 8,211 (ideal 1, expected 1) in 2.04 s") == 1
