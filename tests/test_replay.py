"""A production trace against a real llama-server: replayed serially, every request's measured count equals the
reuse model's expected one, on the hybrid and on the attention control; whatif's best combinations, replayed, are
measured as predicted, one changing the slots and one the RAM cache; a trace the tap wrote replays and goes
through whatif too."""

from __future__ import annotations

import io
import json
import os
import re
import signal
from pathlib import Path

import pytest

from reusebench import records
from reusebench.capability import build
from reusebench.cli import main
from reusebench.config import profiles, workload
from reusebench.records import Role
from reusebench.report import replay_report
from reusebench.run import provenance
from reusebench.run.recording import RunDir
from reusebench.run.service import calls, resolve_for_workload, service_run
from reusebench.tap import InFront

from conftest import child_llama_servers

pytestmark = pytest.mark.e2e

SLICE = ["mooncake-conversation", "--scale", "16", "--limit", "80"]


@pytest.mark.parametrize("profile", ["tiny-qwen35", "tiny-llama"])
def test_serial_replay_measures_what_the_model_expects_on_every_request(
        profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", *SLICE, "--profile", profile, "--results", str(tmp_path), "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    # 80 requests at 1/16 of the trace's lengths: 63,337 prompt tokens; the trace's own prefix cache keeps 2,528 of
    # them (79 x the first 32-token block, which every request shares, is 2,528: nothing else comes back so soon),
    # so its ideal re-processes 63,337 - 2,528 = 60,809
    assert (found["requests"], found["prompt_tokens"], found["ideal"]) == (80, 63_337, 60_809)
    assert (found["failed"], found["differ"], found["not_forced"]) == (0, 0, 0)
    assert found["measured"] == found["expected"] >= found["ideal"]
    assert found["excess_by_class"] == found["expected_by_class"]  # by where each was served from, as predicted
    (run,) = (tmp_path / "runs").iterdir()
    stamp = provenance.read(run)
    assert (stamp.kind, stamp.selection["trace"], stamp.selection["requests"]) == ("replay", "mooncake-conversation.jsonl.gz", 80)
    kept = [r for r in records.read_records(run / "records.jsonl") if r.role == Role.MEASURE]
    assert [r.prompt_n for r in kept] == [r.expected for r in kept]
    assert all(r.extra["answer_forced"] for r in kept)
    assert [r.extra["line"] for r in kept] == list(range(1, 81))
    page = (run / "index.html").read_text()
    assert "<svg class=replay" in page and "data-requests='80'" in page
    assert main(["report", str(run)]) == 0  # read again from its records: a replay, not a workload
    again = capsys.readouterr().out
    assert again.startswith(f"## replay run {run.name}") and "measured equals expected on every one of 80" in again


@pytest.mark.parametrize("profile", ["tiny-qwen35", "tiny-llama"])
def test_whatif_s_best_combinations_are_measured_as_predicted(
        profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # as it is, then parallel 2 (the slots) with cache-ram 0 or -1 (the RAM cache off, or on with no limit): three
    # combinations, all verified
    assert main(["whatif", *SLICE, "--profile", profile, "--try", "parallel=2", "--try", "cache-ram=0,-1",
                 "--verify", "3", "--results", str(tmp_path), "--wide"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("launch") and "measured s" in line)
    table = [re.split(r"\s{2,}", line.strip()) for line in out[head + 2:head + 5]]
    assert [row[0] for row in table[:1]] == ["as it is"]
    assert {row[0] for row in table[1:]} == {"--parallel 2 --cache-ram 0", "--parallel 2 --cache-ram -1"}
    assert [row[3] for row in table] == ["equal"] * 3, "\n".join(out)
    assert all(float(row[5]) > 0 for row in table)  # each replay's measured prefill seconds beside its tokens
    # the prediction's run and the verification's, each stamped with its kind and every launch it names
    stamps = {run: provenance.read(run) for run in (tmp_path / "runs").iterdir()}
    (whatif,) = [s for s in stamps.values() if s.kind == "whatif"]
    (verified,) = [run for run, s in stamps.items() if s.selection.get("for") == "verifying the prediction"]
    assert stamps[verified].kind == "replay" and len(stamps[verified].launches) == len(whatif.launches) == 3
    predicted = next(run for run, s in stamps.items() if s.kind == "whatif")
    assert stamps[verified].selection["prediction"] == predicted.name  # and the prediction's page links to it
    assert f"href='../{verified.name}/index.html'" in (predicted / "index.html").read_text()
    # the tokens over the ideal by where they were served from: the model's classes are the log's, launch by launch
    replays = replay_report.figures(records.read_records(verified / "records.jsonl"))
    assert [f.excess_by_class for f in replays] == [f.expected_by_class for f in replays]
    assert sum(sum(f.excess_by_class.values()) for f in replays) > 0


def test_whatif_s_ranking_fits_100_columns_and_wide_shows_it_whole(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # seven launches at a given rate: predicted with no replay; the long launch lines wrap in their cells
    argv = ["whatif", *SLICE, "--profile", "tiny-qwen35", "--try", "parallel=1,2,4", "--try", "cache-ram=0,8192",
            "--rate", "1000", "--results", str(tmp_path)]
    assert main(argv) == 0
    narrow = capsys.readouterr().out
    assert max(map(len, narrow.splitlines())) <= 100 and "by where served" in narrow
    assert main([*argv, "--wide"]) == 0
    wide = capsys.readouterr().out
    assert max(map(len, wide.splitlines())) > 100 and "| --parallel 4 --cache-ram 8192 |" in wide


def test_a_trace_the_tap_wrote_replays_and_goes_through_whatif(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    load = workload.load_workload("service-small")
    variant = profiles.load_profile(load.profile).variants[0]
    trace = tmp_path / "mine.jsonl"
    via = InFront(tmp_path / "taps", long_prefill_tokens=load.long_prefill_tokens, key_file=tmp_path / "tap.key",
                  trace=trace)
    with records.RecordWriter(tmp_path / "records.jsonl") as writer:
        result = service_run(load, resolve_for_workload(variant, build.of(variant.binary), load), writer,
                             run=RunDir("t", tmp_path), via=via, out=io.StringIO()).run()
    lines = trace.read_text().splitlines()
    assert len(lines) == len([r for r in result.records if not r.error]) > 0  # one line per answered request
    assert main(["replay", str(trace), "--profile", "tiny-llama", "--results", str(tmp_path / "r"), "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    assert (found["requests"], found["differ"], found["failed"]) == (len(lines), 0, 0)
    assert main(["whatif", str(trace), "--profile", "tiny-llama", "--try", "cache-ram=0", "--results",
                 str(tmp_path / "r"), "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert {r["combination"] for r in ranked} == {"as it is", "--cache-ram 0"}


@pytest.mark.parametrize("timed", [False, True], ids=["serial", "timed"])
def test_a_replay_stopped_by_ctrl_c_keeps_what_it_measured_and_exits_130(
        timed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGINT to this process as the fifth request is about to be sent: every request sent is kept, answered
    or cut short by the interruption (serially: the four answered; timed, the first five arrive at once, so the
    others are in flight), the summary says why it stopped, and no server is left."""
    sent: list[int] = []
    real_send = calls.Calls.send

    def fifth_is_stopped(self, client, request, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(request.turn)
        if len(sent) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return real_send(self, client, request, **kwargs)

    monkeypatch.setattr(calls.Calls, "send", fifth_is_stopped)
    before = child_llama_servers()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background `make test &` ignores it
    try:
        status = main(["replay", *SLICE, "--profile", "tiny-llama", "--results", str(tmp_path),
                       *(["--timed", "--speed", "50"] if timed else [])])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert status == 130
    assert child_llama_servers() == before
    (run,) = (tmp_path / "runs").iterdir()
    kept = records.read_records(run / "records.jsonl")
    sent_kept = [r for r in kept if r.role == Role.MEASURE]
    assert len(sent_kept) >= 4 and all(r.error in (None, records.interrupted()) for r in sent_kept)
    if not timed:
        assert [(r.turn, r.error, r.prompt_n == r.expected) for r in sent_kept] == [(n, None, True) for n in range(1, 5)]
    assert kept[-1].role == Role.SESSION and kept[-1].extra["stopped_by"] == records.interrupted()
