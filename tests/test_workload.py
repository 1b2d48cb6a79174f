"""Workload files, the users drawn from them, the log cut into tasks, and the service report's classes
(no server: the real runs are in test_service_load.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reusebench.config import users, workload
from reusebench.llama import task_log
from reusebench.records import Record, Role
from reusebench.report import service_report

MINIMAL = """
profile: tiny-glm-load
seed: 1
users:
  - {name: chat, count: 4, opening_tokens: 256, turns: 9, lora: {share: 0.5, scale: 0.5}}
head_insert: {every_turns: 4}
max_requests: 50
max_seconds: 30
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


def test_shipped_workloads_load() -> None:
    assert set(workload.workload_names()) == {"interference", "report-b-service", "service-small"}
    for name in ("report-b-service", "service-small"):  # report B's service: counts, on the serial schedule
        w = workload.load_workload(name)
        assert w.users > 1 and w.health_check is not None and w.idle_gaps_after_turn and w.schedule == "serial"
    timing = workload.load_workload("interference")  # timings: a request during another's prefill
    assert (timing.arrival, timing.schedule) == ("during_prefill", "free-running")


@pytest.mark.parametrize(("text", "where", "why"), [
    (MINIMAL.replace("seed: 1", "seed: one"), "seed", "required: a whole number"),
    (MINIMAL + "thinktime_s: [1, 2]\n", "thinktime_s", "did you mean 'think_time_s'"),
    (MINIMAL.replace("opening_tokens: 256", "opening_tokens: 2KB"), "users[0].opening_tokens", "2KB"),
    (MINIMAL.replace("share: 0.5", "share: 2"), "users[0].lora.share", "share from 0 to 1"),
    (MINIMAL.replace("turns: 9", "turns: 0"), "users[0].turns", "at least 1"),
    (MINIMAL + "arrival: {pattern: poison, gap_s: 1}\n", "arrival.pattern", "did you mean 'poisson'"),
    (MINIMAL + "arrival: {pattern: staggered}\n", "arrival.gap_s", "need a gap above 0"),
    (MINIMAL + "think_time_s: [3, 1]\n", "think_time_s", "shortest (3) is longer"),
    (MINIMAL + "health_check: {tokens: 21}\n", "health_check.period_s", "required"),
    (MINIMAL + "idle_gaps_after_turn: [4, 2]\n", "idle_gaps_after_turn", "increasing order"),
    (MINIMAL + "idle_gaps_after_turn: [0]\n", "idle_gaps_after_turn[0]", "at least 1"),
    (MINIMAL.replace("max_seconds: 30\n", ""), "max_seconds", "required"),
    (MINIMAL.replace("head_insert: {every_turns: 4}", "head_insert: {every: 4}"), "head_insert.every",
     "unknown field"),
    (MINIMAL + "schedule: free-runing\n", "schedule", "did you mean 'free-running'"),
    (MINIMAL + "idle_gaps_after_turn: [9]\n", "idle_gaps_after_turn[0]", "no user has more than 9 turns"),
    (MINIMAL + "arrival: {pattern: during_prefill}\n", "arrival.pattern", "set schedule: free-running"),
])
def test_an_invalid_workload_names_file_and_field(tmp_path: Path, text: str, where: str, why: str) -> None:
    with pytest.raises(workload.WorkloadError) as error:
        workload.load_workload(write(tmp_path, text))
    assert re.match(rf"{re.escape(str(tmp_path / 'w.yaml'))}:\d+:\d+: {re.escape(where)}: ", str(error.value))
    assert why in str(error.value)


def test_duplicate_keys_and_unknown_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(workload.WorkloadError, match="duplicate key 'seed'"):
        workload.load_workload(write(tmp_path, MINIMAL + "seed: 2\n"))
    with pytest.raises(workload.WorkloadError, match="no such workload"):
        workload.load_workload("no-such-workload")


def test_a_workload_expands_environment_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REUSEBENCH_TEST_PROFILE", "tiny-glm-load")
    path = write(tmp_path, MINIMAL.replace("profile: tiny-glm-load", "profile: ${REUSEBENCH_TEST_PROFILE}"))
    assert workload.load_workload(path).profile == "tiny-glm-load"
    monkeypatch.delenv("REUSEBENCH_TEST_PROFILE")
    with pytest.raises(workload.WorkloadError, match=r"w\.yaml:\d+:\d+: profile: environment variable "
                                                     r"REUSEBENCH_TEST_PROFILE is not set"):
        workload.load_workload(path)


def test_users_arriving_during_a_prefill_need_no_gap_and_have_no_arrival_time(tmp_path: Path) -> None:
    w = workload.load_workload(write(tmp_path, MINIMAL + "arrival: {pattern: during_prefill}\nschedule: free-running\n"))
    assert w.arrival == "during_prefill" and {u.arrival_s for u in users.draw_users(w)} == {0.0}  # events, not times


def test_users_are_drawn_from_the_seed(tmp_path: Path) -> None:
    w = workload.load_workload(write(tmp_path, MINIMAL + "regenerate_share: 0.3\narrival: {pattern: poisson, gap_s: 1}\n"))
    drawn = users.draw_users(w)
    assert drawn == users.draw_users(w)  # the same file gives the same users
    assert [u.lora is not None for u in drawn] == [True, True, False, False]  # half of the group
    assert drawn[2].request_lora == users.NO_LORA  # sent explicitly, not left to the global adapters
    for u in drawn:
        assert u.kinds[0] == users.FIRST
        assert [turn for turn, kind in enumerate(u.kinds, 1) if kind == users.HEAD_INSERT] == [5, 9]
        assert set(u.kinds[1:]) <= {users.CONTINUES, users.REGENERATE, users.HEAD_INSERT}
    assert any(users.REGENERATE in u.kinds for u in drawn)
    assert [u.arrival_s for u in drawn] == sorted(u.arrival_s for u in drawn) and drawn[-1].arrival_s > 0
    other = users.draw_users(workload.load_workload(write(tmp_path, MINIMAL.replace("seed: 1", "seed: 2")
                                                          + "regenerate_share: 0.3\n")))
    assert [u.think_s for u in other] != [u.think_s for u in drawn]



def test_the_turn_after_each_idle_gap_is_planned_after_sleep(tmp_path: Path) -> None:
    w = workload.load_workload(write(tmp_path, MINIMAL.replace("turns: 9", "turns: 5") + "idle_gaps_after_turn: [2, 4]\n"))
    for u in users.draw_users(w):
        planned = users.planned_kinds(w, u)
        assert planned[2] == planned[4] == users.AFTER_SLEEP  # turns 3 and 5, after the gaps after turns 2 and 4
        assert planned[:2] + planned[3:4] == u.kinds[:2] + u.kinds[3:4]


# A launch under load, as b11434 logs it at -lv 4: task 7 decodes on slot 1 while a probe is launched on
# slot 0, which held a 488-token conversation; the launch moves idle slot 2 (300 tokens) to RAM.
CONCURRENT_LOG = """\
0.01.000.000 I slot   operator(): id  1 | task 7 | cached n_tokens = 256, memory_seq_rm [256, end)
0.01.000.100 I slot get_availabl: id  0 | task -1 |  - checking sim = 0.762 (16/21) > 0.100
0.01.000.101 I slot get_availabl: id  1 | task 7 |  - skipping, is_processing = 1
0.01.000.102 I slot get_availabl: id  2 | task -1 |  - checking sim = 0.762 (16/21) > 0.100
0.01.000.103 I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 0.762 (> 0.100 thold), f_keep = 0.033
0.01.000.104 I srv  get_availabl: updating prompt cache
0.01.000.105 I srv   prompt_save:  - saving prompt with length 488, total state size = 0.200 MiB (draft: 0.000 MiB)
0.01.000.106 I srv        update:  - cache size limit reached, removing oldest entry (size = 0.900 MiB)
0.01.000.107 I slot launch_slot_: id  0 | task -1 | clearing cache for lora change. 1 loras -> 1 loras
0.01.000.108 I slot launch_slot_: id  0 | task 9 | processing task, is_child = 0
0.01.000.109 I slot process_sing: id  2 | task -1 | saving idle slot to prompt cache
0.01.000.110 I srv   prompt_save:  - saving prompt with length 300, total state size = 0.100 MiB (draft: 0.000 MiB)
0.01.000.111 I slot prompt_clear: id  2 | task -1 | clearing prompt with 300 tokens
0.01.000.112 I slot   operator(): id  1 | task 7 | cached n_tokens = 320, memory_seq_rm [320, end)
0.01.000.113 I slot   operator(): id  0 | task 9 | new prompt, n_ctx_slot = 16384, n_keep = 0, task.n_tokens = 21
0.01.000.114 I slot   operator(): id  0 | task 9 | cached n_tokens = 0, memory_seq_rm [0, end)
"""


def test_a_launch_under_load_is_cut_out_of_interleaved_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(CONCURRENT_LOG)
    tasks = task_log.TaskLog(log)
    probe = tasks.claim(0, 21, wait_s=0)
    assert probe is not None and probe.task == 9
    assert probe.displaced == [488] and probe.idle_saved == [300] and probe.evicted_mib == [0.9]
    cause = probe.cause()
    assert (cause.selection, cause.slot, cause.task, cause.cached_n_tokens) == ("lcp", 0, 9, 0)
    assert cause.ram_saved_n_tokens == (488,)  # not the idle slot's 300: that one was not displaced by it
    assert cause.lora_clear and not cause.lora_clear_after_ram_restore
    assert tasks.claim(0, 21, wait_s=0) is None  # claimed once
    assert tasks.claim(1, 340, wait_s=0) is None  # task 7 was launched before the log began


def call(user: str, turn: int, step: str, *, start: float, ttft_ms: float, end: float, prompt_n: int, cache_n: int,
         prompt_ms: float = 10.0, slot: int = 0, lora: str = "0:0", decode: float = 2.0,
         cause: dict | None = None, role: str = "measure", **extra: object) -> Record:
    """A call that generated 16 tokens at `decode` ms each, its stream ending at `end`."""
    return Record(run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=512,
                  scenario="w", step=step, role=role, endpoint="/completion", started_at=start, ended_at=end,
                  user=user, turn=turn, slot=slot, lora=lora, prompt_tokens=prompt_n + cache_n, prompt_n=prompt_n,
                  cache_n=cache_n, prompt_ms=prompt_ms, ttft_ms=ttft_ms, predicted_n=16, predicted_ms=16 * decode,
                  excess=prompt_n - 17, cause=cause or {}, extra=dict(extra),
                  expected_hit=step in users.SHOULD_HIT)  # as a workload's records carry it (run/service/texts.py)


def test_the_report_classes_causes_and_interference() -> None:
    summary = Record(run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=512,
                     scenario="w", step="summary", role=Role.SESSION, endpoint="", started_at=0, ended_at=30,
                     extra={"long_prefill_tokens": 4096, "system_prompt_tokens": 25})
    records = [
        summary,
        # prefills from 1.468 s to 5.468 s, then decodes for 32 ms
        call("long-1", 1, users.FIRST, start=0, ttft_ms=5000, end=5.5, prompt_n=8000, cache_n=0, prompt_ms=4000),
        call("chat-1", 1, users.FIRST, start=0.2, ttft_ms=300, end=0.6, prompt_n=300, cache_n=0, slot=1),
        # decodes (3.96 s to 4.6 s) while the long prefill runs, and waits for its first token through it
        call("chat-1", 2, users.CONTINUES, start=2.0, ttft_ms=2000, end=4.6, prompt_n=17, cache_n=300, slot=1,
             decode=40.0, cause={"ram_restored": True}),
        # a fifth of its decoding in the long prefill: counted neither during nor alone
        call("chat-3", 1, users.FIRST, start=5.0, ttft_ms=10, end=5.52, prompt_n=300, cache_n=0, slot=3,
             decode=4.0),
        call("chat-2", 1, users.FIRST, start=10, ttft_ms=100, end=10.5, prompt_n=300, cache_n=0, slot=2,
             lora="0:0.5"),
        # found in RAM, then cleared because the slot's LoRA was another request's: report B
        call("chat-2", 2, users.CONTINUES, start=11, ttft_ms=100, end=11.5, prompt_n=340, cache_n=0, slot=2,
             lora="0:0.5", cause={"ram_restored": True, "lora_clear": True, "lora_clear_after_ram_restore": True}),
        call("health check", 1, users.HEALTH_CHECK, role="probe", start=12, ttft_ms=10, end=12.1, prompt_n=21,
             cache_n=0, slot=2, cause={"selection": "lcp"}, displaced=[340]),
        call("chat-2", 3, users.CONTINUES, start=13, ttft_ms=100, end=13.5, prompt_n=400, cache_n=0, slot=2,
             lora="0:0.5", cause={"selection": "lru"}),
        call("chat-1", 3, users.HEAD_INSERT, start=14, ttft_ms=100, end=14.5, prompt_n=400, cache_n=0, slot=1),
    ]
    found = {(t.record.user, t.record.turn): t for t in service_report.turns(records)}
    assert found[("chat-1", 2)].outcome == "hit" and found[("chat-1", 2)].route == "RAM-restored"
    assert found[("chat-2", 2)].cause == service_report.LORA_AFTER_RESTORE and found[("chat-2", 2)].with_lora
    assert found[("chat-2", 3)].cause == service_report.SIMILARITY_STOLE  # the probe took slot 2 after turn 2
    assert found[("chat-1", 3)].cause is None and not found[("chat-1", 3)].should_hit
    health = service_report.health_effect(records, 4096)
    assert (health.probes, health.took_slot, health.took_big_slot, health.pushed_to_ram) == (1, 1, 0, 1)
    interference = service_report.interference(records, 4096)
    assert interference.decode_during == [40.0] and interference.decode_alone == [2.0] * 5
    assert interference.ttft_during == [2000, 10] and len(interference.ttft_alone) == 5  # chat-3 waited in it
    figures = service_report.figures(records)
    assert figures[f"cause: {service_report.LORA_AFTER_RESTORE}"] == 1
    assert figures["should hit"] == 2 and figures["with LoRA"] == 2 and figures["RAM-restored"] == 1
    assert set(figures) == {*service_report.MISS_FIGURES, *service_report.INTERFERENCE_FIGURES}
    text = service_report.render(records)
    assert "LoRA-change clear after restore: 1 should-hit turns" in text
    assert "took a conversation's slot by prompt similarity: 1 of 1 probes" in text
