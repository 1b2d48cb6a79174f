"""`reusebench nightly` without asv running: which commits a night picks, its plan, its lock, its units.

(Two whole nights over a stand-in llama.cpp, then `reusebench compare`: tests/test_asv_flow.py.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from reusebench import cli, nightly
from reusebench.cli.exits import Exit
from reusebench.nightly import commits, lock
from test_environment import read_by_the_code

REPO = Path(__file__).resolve().parents[1]
UNITS = REPO / "tools" / "systemd"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", "-C", str(repo), *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def history(repo: Path, count: int) -> list[str]:
    """A repository of `count` empty commits on master; their hashes, oldest first."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    for number in range(count):
        git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {number}")
    return git(repo, "rev-list", "--reverse", "master").split()


def test_a_night_picks_what_came_after_the_newest_measured_commit_newest_first_capped(tmp_path: Path) -> None:
    made = history(tmp_path / "repo", 6)
    # nothing measured: the newest three (the cap), oldest first as asv runs them
    assert commits.to_measure(tmp_path / "repo", ["master"], set(), 3) == made[3:]
    # commit 1 measured: 2..5 are new, the cap keeps the newest three
    assert commits.to_measure(tmp_path / "repo", ["master"], {made[1]}, 3) == made[3:]
    assert commits.to_measure(tmp_path / "repo", ["master"], {made[3]}, 3) == made[4:]
    assert commits.to_measure(tmp_path / "repo", ["master"], {made[5]}, 3) == []
    # a branch off commit 2: only its own commit, its base is master's (measured or picked tonight)
    git(tmp_path / "repo", "checkout", "-q", "-b", "fix", made[2])
    git(tmp_path / "repo", "commit", "-q", "--allow-empty", "-m", "the fix")
    fix = git(tmp_path / "repo", "rev-parse", "fix")
    assert commits.to_measure(tmp_path / "repo", ["master", "fix"], set(), 6) == [*made, fix]


def test_a_night_told_its_commits_measures_those_even_before_the_newest_measured(tmp_path: Path) -> None:
    # the history's case: the newest build has a result, an older one none (a stopped run, a failed build); a
    # night left to itself picks nothing, one told the commits measures the older one
    made = history(tmp_path / "repo", 3)
    results = tmp_path / "nightly"
    (results / "asv" / "m").mkdir(parents=True)
    (results / "asv" / "m" / f"{made[2][:8]}-existing.json").write_text(json.dumps({"commit_hash": made[2]}))
    options = nightly.NightOptions(config=REPO / nightly.CONFIG_FILE, results=results, machine="m",
                                   repo=tmp_path / "repo", pull=False, dry_run=True)
    assert nightly.run_night(options).commits == ()
    assert nightly.run_night(dataclasses.replace(options, commits=(made[1],))).commits == (made[1],)


@pytest.mark.e2e
def test_the_dry_run_prints_the_plan_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made = history(tmp_path / "repo", 2)
    results = tmp_path / "nightly"
    assert cli.main(["nightly", "--repo", str(tmp_path / "repo"), "--results", str(results), "--dry-run"]) == Exit.OK
    plan = capsys.readouterr().out.splitlines()
    assert plan[0] == f"nightly plan: 2 commit(s) of {(tmp_path / 'repo').resolve()} (master) not measured yet"
    assert [line.split()[0] for line in plan[1:3]] == [made[0][:12], made[1][:12]]
    # the default selection (tiny-qwen35 through the build asv made, 32K and 128K): its tokens per commit and in all
    assert plan[3].startswith("each commit: a llama-server build (cached per commit and flags), then "
                              "nightly-tiny-qwen35 at 32K 128K: ")
    per_commit = int(plan[3].split("prefill ")[1].split(" tokens")[0].replace(",", ""))
    assert per_commit > 2 * (32768 + 131072)  # at least each size's first load and its reference
    assert plan[4] == f"in all: {2 * per_commit:,} tokens prefilled over 2 commit(s)"
    assert plan[5] == "time: no earlier night here to time it by"
    assert sorted(p.name for p in results.iterdir()) == [nightly.CONFIG_FILE, lock.LOCK_FILE]  # no asv/, no html/


@pytest.mark.e2e
def test_the_plan_times_a_night_by_the_last_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history(tmp_path / "repo", 4)
    results = tmp_path / "nightly"
    results.mkdir()
    (results / "nightly.jsonl").write_text(json.dumps({"commits": ["a", "b"], "seconds": 1200.0}) + "\n"
                                           + json.dumps({"commits": [], "seconds": 30.0}) + "\n")
    assert cli.main(["nightly", "--repo", str(tmp_path / "repo"), "--results", str(results), "--dry-run",
                     "--max-commits", "2"]) == Exit.OK
    # 1,200 s for two commits is 600 s each; two commits tonight: 20 min (a night that measured nothing is no guide)
    assert capsys.readouterr().out.splitlines()[-1] == "time: about 20 min, at the last night's 600 s per commit here"


@pytest.mark.e2e
def test_a_second_nightly_on_the_same_results_does_nothing_and_exits_4(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history(tmp_path / "repo", 1)
    results = tmp_path / "nightly"
    results.mkdir()
    with lock.held(results):  # the first nightly, still running
        status = cli.main(["nightly", "--repo", str(tmp_path / "repo"), "--results", str(results), "--dry-run"])
    captured = capsys.readouterr()
    assert status == Exit.BUSY == 4 and captured.out == ""
    assert captured.err.strip() == (f"reusebench nightly: {results.resolve() / lock.LOCK_FILE}: another nightly "
                                    f"(pid {os.getpid()}) is running on {results.resolve()}; this one "
                                    "did nothing")
    assert cli.main(["nightly", "--repo", str(tmp_path / "repo"), "--results", str(results), "--dry-run"]) == 0


@pytest.mark.parametrize("given, says", [
    (["--repo", "{tmp}/none"], "asv.llama.conf.json: repo: {tmp}/none is not a git checkout of llama.cpp"),
    (["--branch", "main"], "asv.llama.conf.json: branches: {tmp}/repo has no branch 'main'"),
])
def test_a_nightly_that_cannot_start_names_the_field_and_exits_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], given: list[str], says: str) -> None:
    history(tmp_path / "repo", 1)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in given]
    if "--repo" not in argv:
        argv += ["--repo", str(tmp_path / "repo")]
    assert cli.main(["nightly", *argv, "--results", str(tmp_path / "n"), "--dry-run"]) == Exit.CONFIG
    assert says.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err


def unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file as {section: {key: [values]}} (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            current.setdefault(key, []).append(value)
    return sections


def test_the_shipped_timer_starts_the_nightly_once_a_night() -> None:
    service, timer = unit(UNITS / "reusebench-nightly.service"), unit(UNITS / "reusebench-nightly.timer")
    assert service["Service"]["Type"] == ["oneshot"]  # the timer cannot start it again while it runs
    (start,) = service["Service"]["ExecStart"]
    program, *argv = shlex.split(start.replace("%h", "/home/box"))
    assert program == "/home/box/reusebench/.venv/bin/reusebench"
    args = cli.build_parser().parse_args(argv)  # what the unit runs is a command line reusebench takes
    assert (args.command, args.repo, args.results) == ("nightly", Path("/home/box/llama.cpp"),
                                                       Path("/home/box/reusebench/results/llama"))
    # every variable it sets is one the code reads
    assert {v.split("=")[0] for v in service["Service"]["Environment"]} <= read_by_the_code()
    assert timer["Timer"]["OnCalendar"] == ["*-*-* 01:30:00"] and timer["Timer"]["Persistent"] == ["true"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
