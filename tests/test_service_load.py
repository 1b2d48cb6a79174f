"""The small workload on the real server (tiny GLM-class hybrid, 4 unified slots, 2 MiB RAM cache, sleep after
3 s), on the serial schedule and free-running: what the workload's structure predicts of each turn; on the
serial schedule, report B's two findings found by cause, the same counts on every run, and a deviation from the
schedule failing the run; and, in the arranged interference workload, that a long prefill slows another user's
decoding. Timings on a shared CPU are noisy: directions only, no numbers."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reusebench import cli, records
from reusebench.capability import build
from reusebench.config import profiles, users, workload
from reusebench.llama import task_log
from reusebench.records import Record, Role
from reusebench.report import service_report, service_runs
from reusebench.run import provenance
from reusebench.run.recording import RunDir
from reusebench.run.service import (
    ScheduleDeviation,
    ServiceRun,
    WorkloadResult,
    resolve_for_workload,
    schedule,
    service_run,
)
from reusebench.run.service.calls import Calls

from conftest import children, heed_ctrl_c

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
SMALL = "service-small"


Ran = tuple[list[Record], ServiceRun, WorkloadResult]


def driver(load: workload.Workload, run_dir: Path, free_running: bool = False) -> ServiceRun:
    variant = profiles.load_profile(load.profile).variants[0]
    writer = records.RecordWriter(run_dir / "records.jsonl")
    return service_run(load, resolve_for_workload(variant, build.of(variant.binary), load), writer, run=RunDir("t", run_dir),
                       free_running=free_running,
                       out=io.StringIO())


def run(load: workload.Workload, run_dir: Path, free_running: bool = False) -> Ran:
    service = driver(load, run_dir, free_running)
    with service.recorder.writer:
        result = service.run()
    kept = records.read_records(run_dir / "records.jsonl")
    print(service_report.render(kept))
    return kept, service, result


@pytest.fixture(scope="module")
def serial_small(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run(workload.load_workload(SMALL), tmp_path_factory.mktemp("serial"))


@pytest.fixture(scope="module")
def free_small(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return run(workload.load_workload(SMALL), tmp_path_factory.mktemp("free"), free_running=True)


@pytest.fixture(params=["serial", "free-running"])
def small(request: pytest.FixtureRequest) -> Ran:
    return request.getfixturevalue("serial_small" if request.param == "serial" else "free_small")


def calls(kept: list[Record]) -> list[Record]:
    return [r for r in kept if r.role in (Role.MEASURE, Role.PROBE)]


def test_every_call_is_recorded_with_its_user_turn_slot_and_cause(small) -> None:
    kept, driver, result = small
    assert not [r.error for r in kept if r.error]
    assert result.stopped_by == "every user finished" and result.sleeps == 1
    for r in calls(kept):
        assert r.user and r.turn and r.slot in range(4), r
        assert r.cause is not None and r.cause["slot"] == r.slot, r  # its own launch, out of interleaved lines
        assert r.prompt_n + r.cache_n == r.prompt_tokens
    assert {r.user for r in calls(kept)} == {u.name for u in driver.users} | {users.HEALTH_CHECK}
    assert kept[-1].role == Role.SESSION and kept[-1].extra["requests"] == len(calls(kept))
    assert not driver.handle.process.is_running()


def test_turn_kinds_are_what_the_workload_predicts(small) -> None:
    """Each user's turns in order, of the kinds its plan draws, the turn after the idle gap 'after sleep'; and the
    gap fell between those turns."""
    kept, driver, result = small
    (gap_began, gap_ended), = result.gaps
    (gap_turn,) = driver.workload.idle_gaps_after_turn
    for user in driver.users:
        sent = sorted((r for r in calls(kept) if r.user == user.name), key=lambda r: r.turn)
        assert [r.turn for r in sent] == list(range(1, user.turns + 1))
        predicted = users.planned_kinds(driver.workload, user)
        assert [r.step for r in sent] == list(predicted)
        assert [r.expected_hit for r in sent] == [kind in users.SHOULD_HIT for kind in predicted]
        assert sent[gap_turn - 1].ended_at <= gap_began and sent[gap_turn].started_at >= gap_ended


def test_turns_that_cannot_hit_reuse_no_more_than_the_shared_opening(small) -> None:
    kept, driver, result = small
    shared = driver.workload.system_prompt_tokens + 1  # BOS and the system prompt every conversation opens with
    cannot = [r for r in calls(kept) if r.step in users.CANNOT_HIT]
    assert {r.step for r in cannot} == set(users.CANNOT_HIT) & set(users.WORKLOAD_KINDS)
    assert all(r.cache_n <= shared for r in cannot), [(r.user, r.turn, r.cache_n) for r in cannot]
    (_, gap_ended), = result.gaps
    woke = [r for r in calls(kept) if r.cause["woke"]]
    assert len(woke) == 1 and woke[0].started_at >= gap_ended  # the first request after the gap, maybe the probe


def test_a_serial_run_measures_what_the_reuse_model_expects_of_every_call(serial_small) -> None:
    # one request at a time in a fixed order: the build's reuse model predicts every call, health checks included
    kept, _, _ = serial_small
    calls = [r for r in kept if r.role in (Role.MEASURE, Role.PROBE)]
    assert calls and [r.prompt_n for r in calls] == [r.expected for r in calls]
    assert "measured equals expected (the build's reuse model) on every one of" in service_report.render(kept)


def test_report_b_findings_appear_by_cause(serial_small) -> None:
    kept, driver, _ = serial_small
    found = service_report.turns(kept)
    lora_clears = [t for t in found if t.cause == service_report.LORA_AFTER_RESTORE]
    assert lora_clears, service_report.render(kept)
    for t in lora_clears:  # a should-hit turn that found its conversation in RAM and reused nothing
        assert t.should_hit and t.route == "RAM-restored" and t.record.cache_n == 0
    health = service_report.health_effect(kept, driver.workload.long_prefill_tokens)
    assert health.took_slot >= 1, service_report.render(kept)
    probe_tokens = driver.workload.health_check.tokens
    took = [r for r in kept if r.role == Role.PROBE and r.cause["selection"] == "lcp" and r.extra["displaced"]]
    # at least one of them pushed out a conversation, not just another probe's few tokens
    assert any(max(r.extra["displaced"]) > 4 * probe_tokens for r in took)
    should_have_hit = [t for t in found if t.should_hit and t.outcome != "hit"]
    assert sum(service_report.miss_causes(found).values()) == len(should_have_hit)  # each miss has one cause
    text = service_report.render(kept)
    assert f"{service_report.LORA_AFTER_RESTORE}: {len(lora_clears)} should-hit turns" in text
    assert f"took a conversation's slot by prompt similarity: {health.took_slot} of {health.probes}" in text


def test_a_long_prefill_slows_the_other_users_decode(tmp_path: Path) -> None:
    """Arranged by events (workloads/interference.yaml): the chat user arrives as the 32K document's prefill
    starts, so its first turn decodes in batches shared with the document's chunks; its last turns decode alone.
    A token that shares its batch with 2,048 prompt tokens takes longer than one alone, on any CPU: direction only."""
    load = workload.load_workload("interference")
    kept, service, result = run(load, tmp_path)
    assert service.schedule_name == "free-running"  # the workload's own: the chat user talks during the prefill
    assert result.stopped_by == "every user finished"
    found = service_report.interference(kept, load.long_prefill_tokens)
    chat = sorted((r for r in calls(kept) if (r.prompt_n or 0) < load.long_prefill_tokens), key=lambda r: r.turn or 0)
    per_token = [r.predicted_ms / r.predicted_n for r in chat if r.predicted_ms is not None and r.predicted_n]
    # Turn 1 decodes in 9 of the prefill's 16 batches: during, with 7 batches to spare. The last of the 12 turns
    # starts 10 turns after the prefill's last batch: alone. Turns 2 and 3 meet the prefill's end, and the side
    # they fall on follows when a busy client thread reads the long stream's end (the spans are anchored there;
    # under two busy loops turn 3 fell in neither), so they are left out.
    assert len(per_token) == 12 and per_token[0] in found.decode_during and per_token[-1] in found.decode_alone
    ratio = found.ratio(found.decode_during, found.decode_alone, 50)
    print(f"decode ms/token during a long prefill / with none (p50): {ratio:.2f}")
    assert ratio > 1


def test_the_serial_schedule_sends_one_request_at_a_time_in_its_order(serial_small) -> None:
    """Read back from the kept (scrubbed) server log, apart from the driver's own check: the calls' tasks were
    launched in the schedule's order, each after the one before had been released."""
    kept, driver, _ = serial_small
    planned = [("health check", s.number) if s.user is None else (s.user.name, s.number)
               for s in schedule.serial_schedule(driver.workload, driver.users) if not s.is_gap]
    sent = calls(kept)
    assert [(r.user, r.turn) for r in sent] == planned
    log = task_log.TaskLog(driver.recorder.log_dir / f"{driver.workload.name}.log")
    tasks = [log.claim(r.slot, r.prompt_tokens, wait_s=0) for r in sent]
    assert all(t is not None and t.task == r.extra["task"] for t, r in zip(tasks, sent))
    launched = [t.launched_at for t in tasks]
    assert launched == sorted(launched)
    assert all(earlier.released_at < later.launched_at for earlier, later in zip(tasks, tasks[1:]))
    assert kept[-1].extra["schedule"] == "serial" and kept[-1].extra["stopped_by"] == "every user finished"


def test_the_serial_schedule_gives_the_same_counts_on_every_run(tmp_path: Path) -> None:
    """Two runs through the command line (``--repeat 2``): every call lands in the same slot with the same counts and
    the same cause, so every count figure is the same."""
    assert cli.main(["workload", SMALL, "--repeat", "2", "--results", str(tmp_path)]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    stamp = provenance.read(run_dir)
    assert (stamp.kind, stamp.selection["workload"], stamp.selection["repeat"]) == ("workload", SMALL, 2)
    (launch,) = stamp.launches.values()
    assert "--ctx-size" in launch  # the launch as resolved for the workload's users, not as the profile wrote it
    first, second = service_runs.runs(records.read_records(run_dir / "records.jsonl"))

    def seen(run: list[Record]) -> list[tuple]:
        return [(r.user, r.turn, r.step, r.slot, r.prompt_n, r.cache_n, r.cause["selection"], r.cause["ram_restored"],
                 r.cause["lora_clear"]) for r in calls(run)]

    assert seen(first) == seen(second) and len(seen(first)) == first[-1].extra["requests"]
    figures = service_report.figures(first)
    assert {name: figures[name] for name in service_report.MISS_FIGURES} == {
        name: service_report.figures(second)[name] for name in service_report.MISS_FIGURES}
    report = (run_dir / "report.md").read_text()
    for name in service_report.MISS_FIGURES:
        assert re.search(rf"\| {re.escape(name)} +\| [\d.]+ +\| [\d.]+ +\| [\d.]+ +\| yes ", report), name


def test_a_sleep_outside_an_idle_gap_fails_the_serial_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine too slow for the profile's sleep-idle-seconds, made real: before the third request the test waits
    until the server sleeps. The counts would now depend on the machine's speed, so the run fails, naming it."""
    load = workload.load_workload(SMALL)
    service = driver(load, tmp_path)
    third = [s for s in schedule.serial_schedule(load, service.users) if not s.is_gap][2]
    label = f"{third.user.name}/{third.number}"
    send = Calls.send

    def slow_send(self, client, request, **kwargs):
        if request.label == label:
            assert service.handle.wait_until_asleep(10).asleep
        return send(self, client, request, **kwargs)

    monkeypatch.setattr(Calls, "send", slow_send)
    with service.recorder.writer, pytest.raises(ScheduleDeviation, match=f"^{label}: the server slept before it"):
        service.run()
    kept = records.read_records(tmp_path / "records.jsonl")
    assert kept[-1].role == Role.SESSION and kept[-1].extra["stopped_by"].startswith(f"failed: {label}: ")
    assert [(r.user, r.turn) for r in calls(kept)][-1] == (third.user.name, third.number)  # kept, with its cause
    assert not service.handle.process.is_running()


def test_a_free_running_report_says_why_its_counts_vary(free_small, serial_small) -> None:
    kept, _, _ = free_small
    assert kept[-1].extra["schedule"] == "free-running"
    assert service_report.FREE_RUNNING_NOTE in service_report.render(kept)
    assert service_report.FREE_RUNNING_NOTE not in service_report.render(serial_small[0])


@pytest.mark.parametrize(("stop", "mode"), [(signal.SIGINT, []), (signal.SIGTERM, []), (signal.SIGINT, ["--free-running"])],
                         ids=["Ctrl-C", "SIGTERM", "Ctrl-C free-running"])
def test_ctrl_c_or_sigterm_keeps_every_record_and_stops_the_server(tmp_path: Path, stop: signal.Signals,
                                                                   mode: list[str]) -> None:
    command = [sys.executable, "-m", "reusebench", "workload", SMALL, *mode, "--results", str(tmp_path)]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=heed_ctrl_c)
    try:
        deadline = time.monotonic() + 300  # the first records come within seconds, on a loaded machine too
        while sum(len(p.read_text().splitlines()) for p in tmp_path.glob("runs/*/records.jsonl")) < 3:
            assert proc.poll() is None, "the workload ended before its third record"
            assert time.monotonic() < deadline, "the workload wrote no third record within 300 s"
            time.sleep(0.2)
        servers = children(proc.pid, "llama-server")
        proc.send_signal(stop)  # a call may be in flight, or its log lines looked up, or a gap held
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # the test itself failed or was stopped: its server, in a session of its own,
            left = children(proc.pid, "llama-server")  # would outlive a killed workload, so it goes too
            proc.kill()
            proc.wait()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
    assert proc.returncode == 130 and len(servers) == 1, output
    said = output.strip().splitlines()[-1]
    match = re.fullmatch(r"interrupted: every server stopped; (\d+) records kept in (\S+)", said)
    assert match, output
    kept = records.read_records(Path(match.group(2)))
    assert len(kept) == int(match.group(1)) >= 4
    assert kept[-1].role == Role.SESSION and kept[-1].extra["stopped_by"] == "interrupted (Ctrl-C)"
    assert all(r.error in (None, "interrupted (Ctrl-C)") for r in kept)
    assert not Path(f"/proc/{servers[0]}").exists()  # stopped and reaped, not orphaned
