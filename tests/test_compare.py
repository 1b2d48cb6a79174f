"""`reusebench compare`'s noise rule: counts exact, times and the harness's budget beyond 10%, the GPU state never.

(Two real nights and a compare that flags a real regression: tests/test_asv_flow.py.)
"""

from __future__ import annotations

import math

from reusebench.report import asv_results

TOKENS = ("reuse.ReprocessedTokens.track_reprocessed_tokens", ("'32K'", "'v'", "'reask/new question'"))
SECONDS = ("reuse.FirstLoad.track_prefill_seconds", ("'32K'", "'v'"))
BUDGET = ("harness.PrefillBudget.track_extra_prefill_tokens", ("'128K'", "'v'"))
VERDICT = ("verdicts.OptionVerdict.track_verdict_code", ("'v'", "'cache-reuse'"))
TEMPERATURE = ("gpu_state.FirstLoadGpuState.track_start_temperature_c", ("'32K'", "'v'"))


def judged(before: dict, after: dict) -> dict:
    return {c.key: c.kind for c in asv_results.compare(before, after)}


def test_a_count_changes_exactly_and_one_token_more_is_a_regression() -> None:
    assert judged({TOKENS: 515.0}, {TOKENS: 516.0}) == {TOKENS: "regression"}
    assert judged({TOKENS: 32768.0}, {TOKENS: 515.0}) == {TOKENS: "improvement"}
    assert judged({TOKENS: 515.0}, {TOKENS: 515.0}) == {}


def test_a_time_and_the_harness_budget_count_only_beyond_ten_percent() -> None:
    # 100 s -> 109 s is within asv's factor 1.1; 111 s is beyond it, and 90 s back (100/90 = 1.11) too
    assert judged({SECONDS: 100.0}, {SECONDS: 109.0}) == {}
    assert judged({SECONDS: 100.0}, {SECONDS: 111.0}) == {SECONDS: "regression"}
    assert judged({SECONDS: 100.0}, {SECONDS: 90.0}) == {SECONDS: "improvement"}
    # a stopped step's last batch lands or not: 531,083 -> 533,131 extra tokens at 128K is one 2,048-token batch
    assert judged({BUDGET: 531083.0}, {BUDGET: 533131.0}) == {}


def test_verdict_codes_worse_than_active_regress_and_active_improves() -> None:
    assert judged({VERDICT: 1.0}, {VERDICT: 2.0}) == {VERDICT: "regression"}  # ACTIVE -> DISABLED
    assert judged({VERDICT: 2.0}, {VERDICT: 1.0}) == {VERDICT: "improvement"}
    assert judged({VERDICT: 1.0}, {VERDICT: 0.0}) == {VERDICT: "changed"}  # ACTIVE -> UNVERIFIED: not decided


def test_the_gpu_state_explains_and_never_counts_and_failures_and_n_a_are_named() -> None:
    assert judged({TEMPERATURE: 40.0}, {TEMPERATURE: 80.0}) == {}
    assert judged({TOKENS: 515.0}, {TOKENS: None}) == {TOKENS: "regression"}  # failed on the new commit
    assert judged({TOKENS: math.nan}, {TOKENS: 515.0}) == {TOKENS: "changed"}  # applies to one build only
    assert judged({}, {TOKENS: math.nan}) == {}


def test_the_table_puts_regressions_first_and_counts_them() -> None:
    changes = asv_results.compare({TOKENS: 515.0, SECONDS: 100.0}, {TOKENS: 2066.0, SECONDS: 80.0})
    assert [c.kind for c in changes] == ["regression", "improvement"]
    text = asv_results.render(changes, "a" * 40, "b" * 40)
    assert [cell.strip() for cell in text.splitlines()[2].split("|")[1:7]] == [
        "regression", "reuse.ReprocessedTokens.track_reprocessed_tokens", "32K, v, reask/new question", "515", "2,066",
        "4.01"]
    assert text.splitlines()[-1] == f"{'a' * 12} -> {'b' * 12}: 1 regression(s), 2 change(s)"


STEP_SECONDS = ("reuse.StepSeconds.track_prefill_seconds", ("'32K'", "'v'", "'reask/new question'"))
STEP_BUSY = ("gpu_state.MachineBusy.track_busy", ("'32K'", "'v'", "'reask/new question'"))
FIRST_BUSY = ("gpu_state.MachineBusy.track_busy", ("'32K'", "'v'", "'first_load/cold'"))
LOWEST = ("gpu_state.FirstLoadSpread.track_min_seconds", ("'32K'", "'v'"))
HIGHEST = ("gpu_state.FirstLoadSpread.track_max_seconds", ("'32K'", "'v'"))


def test_a_time_taken_on_a_busy_machine_is_not_judged_and_the_counts_still_are() -> None:
    # the two loaded runs of one build: 1.3-13x slower steps, the counts equal: no regression
    before = {SECONDS: 10.0, FIRST_BUSY: 0.0, STEP_SECONDS: 0.4, STEP_BUSY: 1.0, TOKENS: 515.0}
    after = {SECONDS: 130.0, FIRST_BUSY: 1.0, STEP_SECONDS: 5.2, STEP_BUSY: 0.0, TOKENS: 515.0}
    changes = asv_results.compare(before, after)
    assert {c.key: c.kind for c in changes} == {SECONDS: "busy", STEP_SECONDS: "busy"}
    text = asv_results.render(changes, "a" * 40, "b" * 40)
    assert "2 time(s) not judged: other work loaded the machine while they were taken" in text
    assert text.splitlines()[-1] == f"{'a' * 12} -> {'b' * 12}: 0 regression(s), 0 change(s)"
    # a count on a busy machine is still exact
    assert judged({**before, TOKENS: 515.0}, {**after, TOKENS: 516.0})[TOKENS] == "regression"
    # quiet on both sides (or not recorded, as in older results): the factor decides as before
    assert judged({STEP_SECONDS: 0.4, STEP_BUSY: 0.0}, {STEP_SECONDS: 5.2, STEP_BUSY: 0.0}) == {STEP_SECONDS: "regression"}


def test_repeated_first_loads_regress_only_when_their_ranges_part() -> None:
    # medians 100 -> 120 s (beyond 10%), but the repeats ran 90-125 and 105-130 s: the ranges overlap, no finding
    overlapping = ({SECONDS: 100.0, LOWEST: 90.0, HIGHEST: 125.0}, {SECONDS: 120.0, LOWEST: 105.0, HIGHEST: 130.0})
    assert judged(*overlapping) == {}
    # 90-105 s then 120-130 s: 120 > 105 x 1.1 = 115.5, a regression
    parted = ({SECONDS: 100.0, LOWEST: 90.0, HIGHEST: 105.0}, {SECONDS: 125.0, LOWEST: 120.0, HIGHEST: 130.0})
    assert judged(*parted)[SECONDS] == "regression"


HARNESS = ("harness.HarnessOverhead.track_overhead_seconds", ("'32K'", "'v'"))
REPLAY_SECONDS = ("replay.TraceReplaySeconds.track_prefill_seconds", ("'prefill'",))
REPLAY_BUSY = ("replay.TraceReplayBusy.track_busy", ())


def test_the_run_s_other_times_are_not_judged_where_any_part_of_it_met_a_busy_machine() -> None:
    # two runs of one build beside other work, measured: the replay's prefill 64 -> 118 s, the harness's overhead
    # 0.78 -> 0.87 s; one reuse step was busy in the first run, the replay's end in the second
    before = {REPLAY_SECONDS: 64.2, HARNESS: 0.784, STEP_BUSY: 1.0, REPLAY_BUSY: 0.0, TOKENS: 515.0}
    after = {REPLAY_SECONDS: 118.0, HARNESS: 0.867, STEP_BUSY: 0.0, REPLAY_BUSY: 1.0, TOKENS: 515.0}
    assert judged(before, after) == {REPLAY_SECONDS: "busy", HARNESS: "busy"}
    # neither run busy anywhere: the factor judges them as before
    quiet = {STEP_BUSY: 0.0, REPLAY_BUSY: 0.0}
    assert judged({**before, **quiet}, {**after, **quiet}) == {REPLAY_SECONDS: "regression", HARNESS: "regression"}
