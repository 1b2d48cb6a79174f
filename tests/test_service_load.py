"""The small workload on the real server (tiny GLM-class hybrid, 4 unified slots, 2 MiB RAM cache, sleep after
3 s): what the workload's structure predicts of each turn and report B's two findings found by cause; and, in an
arranged workload, that a long prefill slows another user's decoding. Timings on a shared CPU are noisy:
directions only, no numbers."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reusebench.config import profiles, users, workload
from reusebench import records
from reusebench.report import service_report
from reusebench.run.driver import DriverResult, ServiceDriver
from reusebench.records import Record, Role

from conftest import children, heed_ctrl_c

REPO = Path(__file__).resolve().parents[1]
SMALL = "service-small"


def run(load: workload.Workload, run_dir: Path) -> tuple[list[Record], ServiceDriver, DriverResult]:
    variant = profiles.load_profile(load.profile).variants[0]
    with records.RecordWriter(run_dir / "records.jsonl") as writer:
        driver = ServiceDriver(load, variant, writer, run_id="t", log_dir=run_dir / "logs", out=io.StringIO())
        result = driver.run()
    kept = records.read_records(run_dir / "records.jsonl")
    print(service_report.render(kept))
    return kept, driver, result


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Record], ServiceDriver, DriverResult]:
    return run(workload.load_workload(SMALL), tmp_path_factory.mktemp("service"))


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
    assert not driver.handle.server.is_running()


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
    kept, driver, _ = small
    shared = driver.workload.system_prompt_tokens + 1  # BOS and the system prompt every conversation opens with
    cannot = [r for r in calls(kept) if r.step in users.CANNOT_HIT]
    assert {r.step for r in cannot} == set(users.CANNOT_HIT)
    assert all(r.cache_n <= shared for r in cannot), [(r.user, r.turn, r.cache_n) for r in cannot]
    (_, gap_ended), = small[2].gaps
    woke = [r for r in calls(kept) if r.cause["woke"]]
    assert len(woke) == 1 and woke[0].started_at >= gap_ended  # the first request after the gap, maybe the probe


def test_report_b_findings_appear_by_cause(small) -> None:
    kept, driver, _ = small
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
    """Arranged by events (tests/data/interference.yaml): the chat user arrives as the 32K document's prefill
    starts, so its first turn decodes in batches shared with the document's chunks; its last turns decode alone.
    A token that shares its batch with 2,048 prompt tokens takes longer than one alone, on any CPU: direction only."""
    load = workload.load_workload(REPO / "tests" / "data" / "interference.yaml")
    kept, _, result = run(load, tmp_path)
    assert result.stopped_by == "every user finished"
    found = service_report.interference(kept, load.long_prefill_tokens)
    # turn 1 (9 of the prefill's 16 batches) is during; turns 3-12 start after batch 16, alone
    assert found.decode_during and len(found.decode_alone) >= 10
    ratio = found.ratio(found.decode_during, found.decode_alone, 50)
    print(f"decode ms/token during a long prefill / with none (p50): {ratio:.2f}")
    assert ratio > 1


def test_ctrl_c_keeps_every_record_and_stops_the_server(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "reusebench", "workload", SMALL, "--results", str(tmp_path)]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=heed_ctrl_c)
    try:
        deadline = time.monotonic() + 300  # the first records come within seconds, on a loaded machine too
        while sum(len(p.read_text().splitlines()) for p in tmp_path.glob("runs/*/records.jsonl")) < 3:
            assert proc.poll() is None, "the workload ended before its third record"
            assert time.monotonic() < deadline, "the workload wrote no third record within 300 s"
            time.sleep(0.2)
        servers = children(proc.pid, "llama-server")
        proc.send_signal(signal.SIGINT)  # while users are talking: some calls are in flight
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and len(servers) == 1, output
    said = output.strip().splitlines()[-1]
    match = re.fullmatch(r"interrupted: every server stopped; (\d+) records kept in (\S+)", said)
    assert match, output
    kept = records.read_records(Path(match.group(2)))
    assert len(kept) == int(match.group(1)) >= 4
    assert kept[-1].role == Role.SESSION and kept[-1].extra["stopped_by"] == "interrupted (Ctrl-C)"
    assert all(r.error in (None, "interrupted (Ctrl-C)") for r in kept)
    assert not Path(f"/proc/{servers[0]}").exists()  # stopped and reaped, not orphaned
