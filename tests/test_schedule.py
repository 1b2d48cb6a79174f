"""The serial schedule, worked out by hand from a small workload file (no server: the real runs are in
test_service_load.py), and the log check that tells a task launched while another still ran."""

from __future__ import annotations

from pathlib import Path

from reusebench.config import users, workload
from reusebench.llama import task_log
from reusebench.run.service import schedule

# Users a-1, a-2 (3 turns) and b-1 (1 turn) arrive 1 s apart; every think time is 2 s; a probe every 2.5 s.
WORKLOAD = """
profile: tiny-glm-load
seed: 1
users:
  - {name: a, count: 2, opening_tokens: 64, turns: 3}
  - {name: b, count: 1, opening_tokens: 64, turns: 1}
think_time_s: [2, 2]
arrival: {pattern: staggered, gap_s: 1}
health_check: {tokens: 8, period_s: 2.5}
max_requests: 50
max_seconds: 30
"""


def steps_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    w = workload.load_workload(path)
    steps = schedule.cut(schedule.serial_schedule(w, users.draw_users(w)), w.max_requests)
    return ["gap" if s.is_gap else f"probe {s.number} @{s.at_s:g}" if s.user is None
            else f"{s.user.name}/{s.number} @{s.at_s:g}" for s in steps]


def test_requests_go_in_the_order_they_would_start(tmp_path: Path) -> None:
    # a-1 at 0, 2, 4; a-2 at 1, 3, 5; b-1 at 2; probes at 2.5 and 5 (the last turn is at 5). At 2, a-1 (user 0)
    # before b-1 (user 2); at 5, the turn before the probe.
    assert steps_of(tmp_path, WORKLOAD) == [
        "a-1/1 @0", "a-2/1 @1", "a-1/2 @2", "b-1/1 @2", "probe 1 @2.5", "a-2/2 @3", "a-1/3 @4", "a-2/3 @5",
        "probe 2 @5"]


def test_an_idle_gap_waits_for_the_users_it_holds_back(tmp_path: Path) -> None:
    # The gap after turn 2 waits for a-1 (turn 2 at 2) and a-2 (at 3): it comes at 3, and their third turns
    # think 2 s from there (5, 5). b-1 (one turn, at 2) and probe 1 (2.5) come before it, probe 2 (5) after.
    assert steps_of(tmp_path, WORKLOAD + "idle_gaps_after_turn: [2]\n") == [
        "a-1/1 @0", "a-2/1 @1", "a-1/2 @2", "b-1/1 @2", "probe 1 @2.5", "a-2/2 @3", "gap", "a-1/3 @5", "a-2/3 @5",
        "probe 2 @5"]


def test_the_request_bound_cuts_the_schedule_and_a_gap_with_nothing_after_it(tmp_path: Path) -> None:
    # 6 requests: up to a-2/2; the gap after it would hold nothing back
    assert steps_of(tmp_path, (WORKLOAD + "idle_gaps_after_turn: [2]\n").replace("max_requests: 50", "max_requests: 6")
                    ) == ["a-1/1 @0", "a-2/1 @1", "a-1/2 @2", "b-1/1 @2", "probe 1 @2.5", "a-2/2 @3"]


def test_two_gaps_a_user_they_do_not_wait_for_and_a_probe_at_a_gap(tmp_path: Path) -> None:
    # Gaps after turns 1 and 2 wait for a-1 and a-2 (3 turns each), not for b-1 (1 turn, at 2). Gap 1 comes at 1
    # (a-2's first turn), their second turns think from there (3, 3); gap 2 comes at 3, their third turns at 5.
    # b-1 at 2 falls after gap 1 by time; the probe at 3 is not later than gap 2, so it comes before it.
    text = WORKLOAD.replace("period_s: 2.5", "period_s: 3") + "idle_gaps_after_turn: [1, 2]\n"
    assert steps_of(tmp_path, text) == [
        "a-1/1 @0", "a-2/1 @1", "gap", "b-1/1 @2", "a-1/2 @3", "a-2/2 @3", "probe 1 @3", "gap", "a-1/3 @5",
        "a-2/3 @5"]


# Two tasks on slots 0 and 1 as b11434 logs them: task 3 is launched while task 2 still runs; task 5 after both
# were released.
OVERLAP_LOG = """\
0.01.000.100 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1
0.01.000.101 I slot launch_slot_: id  0 | task 2 | processing task, is_child = 0
0.01.000.102 I slot update_slots: id  0 | task 2 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 40
0.01.000.200 I slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1
0.01.000.201 I slot launch_slot_: id  1 | task 3 | processing task, is_child = 0
0.01.000.202 I slot update_slots: id  1 | task 3 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 50
0.01.000.300 I slot      release: id  0 | task 2 | stop processing: n_tokens = 48, truncated = 0
0.01.000.400 I slot      release: id  1 | task 3 | stop processing: n_tokens = 58, truncated = 0
0.01.000.500 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = 100
0.01.000.501 I slot launch_slot_: id  0 | task 5 | processing task, is_child = 0
0.01.000.502 I slot update_slots: id  0 | task 5 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 60
"""


def test_the_log_tells_a_task_launched_while_another_ran(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(OVERLAP_LOG)
    tasks = task_log.TaskLog(log)
    first, second, third = (tasks.claim(slot, n, wait_s=0) for slot, n in ((0, 40), (1, 50), (0, 60)))
    assert first and second and third
    assert tasks.running_at_launch(first) == []
    assert tasks.running_at_launch(second) == [2]
    assert tasks.running_at_launch(third) == []
