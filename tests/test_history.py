"""`make history` (tools/history.py): which builds it measures, how it judges each pair of neighbours, and the
ledger (history.json) that a second run goes on from.

The pairs' tests give the history asv's figures as asv stores them and, where a pair is bisected, builds whose
figures a table fixes (a stand-in for `measure_build`: a real one needs a llama.cpp build per point, which
tests/test_bisect.py's clone test does); the ledger's are its file across two runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reusebench import bisect
from reusebench.llama import builder

from conftest import load_tool

history = load_tool("history")
TOKENS = "reuse.ReprocessedTokens.track_reprocessed_tokens"
RESEND = (TOKENS, ("'8K'", "'default'", "'resend/same prompt'"))
REASK = (TOKENS, ("'8K'", "'default'", "'reask/new question'"))
BUSY = ("gpu_state.MachineBusy.track_busy", ("'8K'", "'default'", "'resend/same prompt'"))
NUMBERS = (100, 101, 102, 103, 104)  # the published builds b100 to b104
PROBE = bisect.Probe("tiny-llama", ("default",), (8192,), ("resend",), verify=False, results=Path("unused"))
FIGURE = bisect.FigureKey("default", "8K", "resend/same prompt", "tokens")


def judged(tmp_path: Path, before: dict, after: dict, monkeypatch: pytest.MonkeyPatch,
           column: list[int | None] | None = None) -> tuple[object, list[str]]:
    """Judge the pair b100..b104 from asv's figures; where it bisects, build bN measures `column[N - 100]`
    (None: gives no figures)."""
    measured: list[str] = []

    def measure_build(builds, point, probe, out):
        measured.append(point.name)
        assert column is not None, "the history bisected a pair it should not have"
        value = column[int(point.ref) - 100]
        return bisect.Measurement({}, failed="does not build") if value is None else \
            bisect.Measurement({FIGURE: value})

    monkeypatch.setattr(history.bisect, "measure_build", measure_build)
    ledger = history.Ledger(tmp_path / "history.json")
    history._judge_pair(ledger, "tiny-llama b100..b104", (100, 104), [before, after], NUMBERS, PROBE)
    return ledger, measured


def test_the_history_spreads_its_builds_over_the_published_list() -> None:
    numbers = tuple(range(100, 200, 3))  # 34 published builds
    chosen = history.spread(numbers, 5)
    assert chosen == [100, 124, 148, 175, 199]  # positions 0, 8, 16, 25, 33 of 34: both ends, evenly between
    assert history.spread(numbers, 50) == list(numbers)
    # asv needs dates; they follow the build numbers, so the graph's order is the builds' order
    assert history.tree(9093).date < history.tree(9094).date < history.tree(11434).date
    assert history.tree(11434).release == builder.PINNED  # the newest is the default build's sdist


def test_the_history_measures_exactly_the_builds_named() -> None:
    numbers = tuple(range(100, 200, 3))  # 100, 103, ..., 199
    assert history.named("b199 103,b100 b103", numbers) == [100, 103, 199]  # sorted, each once
    with pytest.raises(ValueError, match="'b101' is not a published build between b100 and b199"):
        history.named("b100 b101", numbers)
    with pytest.raises(ValueError, match="at least two builds"):
        history.named("b100 100", numbers)


def test_a_run_named_in_the_environment_is_checked_as_on_the_command_line(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # argparse checks no choices on a default: HISTORY_ONLY=hybird ran nothing and wrote an empty, complete history
    monkeypatch.setenv("HISTORY_ONLY", "hybird")
    with pytest.raises(SystemExit) as exited:
        history.main([])
    assert exited.value.code == 2
    assert "--only ($HISTORY_ONLY) 'hybird': one of hybrid, control" in capsys.readouterr().err


def test_the_same_counts_on_both_builds_close_the_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a time or the busy flag may differ: counts alone decide, and nothing is built
    ledger, measured = judged(tmp_path, {RESEND: 4.0, BUSY: 0.0}, {RESEND: 4.0, BUSY: 1.0}, monkeypatch)
    assert ledger.done == {"tiny-llama b100..b104": []} and ledger.unresolved == {} and measured == []


def test_a_build_without_figures_leaves_its_pairs_to_the_next_run(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # b104 failed in asv (its counts stored as None) or asv stored nothing for it: whether a count changed cannot
    # be said, so the pair is not closed as "no change" (asv never measures that commit again by itself)
    for after in ({RESEND: None, REASK: 515.0}, {}):
        ledger, measured = judged(tmp_path, {RESEND: 4.0, REASK: 515.0}, after, monkeypatch)
        assert ledger.done == {} and measured == []
        assert ledger.unresolved["tiny-llama b100..b104"].startswith("counts without a figure on b104 ")


def test_a_changed_pair_is_bisected_and_its_change_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # resend 4 -> 516 between b100 and b104, first at b103: the ends, then b102 and b103 (log2 4 = 2 more)
    ledger, measured = judged(tmp_path, {RESEND: 4.0}, {RESEND: 516.0}, monkeypatch, [4, 4, 4, 516, 516])
    [change] = ledger.done["tiny-llama b100..b104"]
    assert (change["profile"], change["last_held"], change["held_value"], change["first_changed"],
            change["changed_value"]) == ("tiny-llama", "b102", 4, "b103", 516)
    assert measured == ["b100", "b104", "b102", "b103"] and ledger.unresolved == {}


@pytest.mark.parametrize(("column", "why"), [
    ([None, 4, 4, 516, 516], "the good build gives no figures: does not build"),
    ([4, 4, 4, 4, 4], "asv's runs differ in a count, the bisect's runs of the two ends do not"),
])
def test_a_bisect_that_cannot_say_leaves_the_pair_unresolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             column: list[int | None], why: str) -> None:
    # an end that gives no figures stopped the whole history before; ends that agree closed the pair as unchanged
    ledger, _ = judged(tmp_path, {RESEND: 4.0}, {RESEND: 516.0}, monkeypatch, column)
    assert ledger.done == {} and ledger.unresolved == {"tiny-llama b100..b104": why}


def test_a_second_history_keeps_what_the_first_found_whatever_it_measures(tmp_path: Path) -> None:
    # the first run (the hybrid) bisected one pair to a change and left one unresolved; the second (the control
    # alone, other builds) closes a pair of its own: the hybrid's change stays, and so does its unresolved pair,
    # which is not among the pairs done (a run of the hybrid tries it again)
    change = {"profile": "tiny-qwen35", "pair": "tiny-qwen35 b9093..b9265", "step": "growth/turn 2", "kind": "tokens",
              "variant": "v", "size": "8K", "last_held": "b9113", "first_changed": "b9246"}
    first = history.Ledger(tmp_path / "history.json")
    first.record("tiny-qwen35 b9093..b9265", [change])
    first.unresolve("tiny-qwen35 b9265..b9341", "counts without a figure on b9341")
    first.write([9093, 9265, 9341], complete=True, seconds=1)
    second = history.Ledger(tmp_path / "history.json")
    assert second.done == {"tiny-qwen35 b9093..b9265": [change]}
    assert second.unresolved == {"tiny-qwen35 b9265..b9341": "counts without a figure on b9341"}
    second.record("tiny-llama b10423..b11010", [])
    second.record("tiny-qwen35 b10423..b11010", [])
    second.write([10423, 11010], complete=True, seconds=1)
    kept = json.loads((tmp_path / "history.json").read_text())
    assert kept["changes"] == [change] and kept["unresolved"] == {"tiny-qwen35 b9265..b9341": "counts without a "
                                                                  "figure on b9341"}
    # by profile, then by build number (as text, b10423 would come before b9093)
    assert kept["bisected"] == ["tiny-llama b10423..b11010", "tiny-qwen35 b9093..b9265", "tiny-qwen35 b10423..b11010"]
    third = history.Ledger(tmp_path / "history.json")
    third.record("tiny-qwen35 b9265..b9341", [])  # resolved at last
    assert third.unresolved == {}
    assert history.Ledger(tmp_path / "absent.json").done == {}


def test_a_change_two_runs_found_is_listed_once(tmp_path: Path) -> None:
    # a run over 6 builds bisected b9093..b9509 and one over 30 bisected b9442..b9518: both found b9496 -> b9509
    found = {"profile": "tiny-llama", "variant": "default", "size": "8K", "step": "growth/turn 1", "kind": "tokens",
             "last_held": "b9496", "first_changed": "b9509"}
    ledger = history.Ledger(tmp_path / "history.json")
    ledger.record("tiny-llama b9442..b9518", [{**found, "pair": "tiny-llama b9442..b9518"}])
    ledger.record("tiny-llama b9093..b9509", [{**found, "pair": "tiny-llama b9093..b9509"}])
    assert [c["pair"] for c in ledger.changes()] == ["tiny-llama b9093..b9509"]
    ledger.write([9093, 9442, 9509, 9518], complete=True, seconds=1)
    again = history.Ledger(tmp_path / "history.json")  # each pair keeps its change in the file
    assert [len(again.done[pair]) for pair in ("tiny-llama b9093..b9509", "tiny-llama b9442..b9518")] == [1, 1]


def test_a_build_without_a_whole_result_is_measured_again() -> None:
    # no result file, or a count asv stored as failed: measured by the next run; a context figure (the busy flag)
    # is not a count
    assert history._incomplete({}) and history._incomplete({RESEND: None, REASK: 515.0})
    assert not history._incomplete({RESEND: 4.0, REASK: 515.0, BUSY: None})


def test_a_write_that_fails_leaves_the_last_history_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the next run reads history.json back: a half-written one would lose every bisect before it
    ledger = history.Ledger(tmp_path / "history.json")
    ledger.record("tiny-llama b100..b104", [])
    ledger.write([100, 104], complete=False, seconds=1)
    before = (tmp_path / "history.json").read_text()
    assert (tmp_path / "history.json").stat().st_mode & 0o777 == 0o644
    ledger.record("tiny-llama b104..b108", [])

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    for name in ("fsync", "replace"):  # the disk fills while the scratch file is written, or at the rename
        with monkeypatch.context() as patched:
            patched.setattr(history.os, name, full_disk)
            with pytest.raises(OSError):
                ledger.write([100, 104, 108], complete=True, seconds=2)
        assert (tmp_path / "history.json").read_text() == before
        assert [p.name for p in tmp_path.iterdir()] == ["history.json"]  # no scratch file left beside it
