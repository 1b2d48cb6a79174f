"""Early stop on the real server: a step whose count is known at the first progress event and whose output
nothing needs is ended there, its slot erased, and every count of the session stays what it is when every
step runs to its end (``--full-prefills``).

The tiny Qwen3.5-class hybrid at 32K, the edit and the restore from disk (which sets up its own slot file):
on a hybrid both the edit (no checkpoint before the divergence at 50%) and the resend after the restore (a
restored slot carries no checkpoints) re-process everything, more than the 8,192 tokens above which a step
may stop.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reusebench.config import profiles
from reusebench.records import Record, Role
from reusebench.run import runner
from reusebench.run.selection import Selection
from reusebench.run.steps import STOPPED

from conftest import child_llama_servers

pytestmark = pytest.mark.e2e

K32, K2 = 32768, 2048
SCENARIOS = ("edit_middle", "restore_disk")


def run(results: Path, *, early_stop: bool, sizes: list[int]) -> runner.ProfileResult:
    out = io.StringIO()
    chosen = Selection(("mmproj=off,cache-reuse=0",), tuple(sizes), tuple(SCENARIOS), early_stop=early_stop)
    result = runner.run_profile(profiles.load_profile("tiny-qwen35"), chosen, results_dir=results, out=out)
    assert result.failed_sessions == 0, out.getvalue()
    return result


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[runner.ProfileResult, runner.ProfileResult]:
    early = run(tmp_path_factory.mktemp("early"), early_stop=True, sizes=[K32, K2])
    timed = run(tmp_path_factory.mktemp("timed"), early_stop=False, sizes=[K32])
    return early, timed


def completions(result: runner.ProfileResult, size: int) -> list[Record]:
    """Measured, setup and reference completions; not the slot calls (saves, restores, the erases)."""
    return [r for r in result.records if r.size == size and r.endpoint == "/completion"]


def counts(records: list[Record]) -> list[tuple[str, str, str, int | None, int | None, int | None, int | None]]:
    return [(r.scenario, r.step, r.role, r.prompt_n, r.cache_n, r.ideal, r.expected) for r in records]


def test_the_edit_stops_at_its_count_which_is_the_whole_prompt(both):
    early, timed = both
    (edit,) = [r for r in completions(early, K32) if r.step == "line at 50%"]
    (edit_timed,) = [r for r in completions(timed, K32) if r.step == "line at 50%"]
    # No checkpoint before the edit at 50%: the hybrid re-processes all of the edited prompt.
    assert edit.prompt_n == edit.prompt_tokens == edit_timed.prompt_n and edit.cache_n == 0
    assert edit.prompt_ms is None and edit.extra["prefill_seconds"] == STOPPED
    assert edit_timed.prompt_ms > 0 and edit_timed.prefilled_n == edit_timed.prompt_n
    # The cancel lands a batch or two later: what the slot held then was erased, and counted.
    (erase,) = [r for r in early.records if r.size == K32 and r.step == "erase slot" and r.scenario == "edit_middle"]
    assert erase.extra["n_erased"] == edit.prefilled_n and 0 < edit.prefilled_n < edit.prompt_n


def test_every_count_is_the_same_with_and_without_early_stop(both):
    early, timed = both
    assert counts(completions(early, K32)) == counts(completions(timed, K32))
    stopped = [r.step for r in completions(early, K32) if r.prompt_ms is None]
    # restore_disk's resend and re-ask stop too: each restores the file first, and the re-ask's reference ran
    # before the restart
    assert stopped == ["line at 50%", "resend", "reask"]


def test_the_budget_counts_what_was_prefilled_and_no_state_reaches_the_next_session(both):
    early, timed = both
    (summary,) = [r for r in early.records if r.size == K32 and r.role == Role.SESSION]
    prefill = summary.extra["prefill"]
    needed = sum(r.prompt_n for r in early.records if r.size == K32 and r.role == Role.MEASURE)
    assert prefill["needed"] == needed and prefill["measure"] < needed
    assert prefill["measure"] == sum(r.prefilled_n for r in early.records if r.size == K32 and r.role == Role.MEASURE)
    # The next session starts cold on its own server, and every server is gone.
    first = next(r for r in early.records if r.size == K2 and r.scenario == "first_load")
    assert first.cache_n == 0 and first.prompt_n == first.prompt_tokens
    assert not child_llama_servers()


def test_on_four_slots_the_stopped_step_s_own_slot_is_erased(tmp_path: Path):
    # tiny-glm-load: 4 slots. The head insert shares only BOS with the first load, so it takes another slot
    # (least recently used), and the erase must reach that one, not the slot holding the document.
    out = io.StringIO()
    result = runner.run_profile(profiles.load_profile("tiny-glm-load"),
                                Selection(sizes=(16384,), scenario_ids=("head_insert",)), results_dir=tmp_path, out=out)
    assert result.failed_sessions == 0, out.getvalue()
    first = next(r for r in result.records if r.scenario == "first_load")
    insert = next(r for r in result.records if r.scenario == "head_insert" and r.role == Role.MEASURE)
    (erase,) = [r for r in result.records if r.step == "erase slot"]
    assert insert.prompt_ms is None and insert.cause["slot"] != first.slot
    assert erase.endpoint == f"/slots/{insert.cause['slot']}?action=erase" and insert.slot == insert.cause["slot"]
    assert erase.extra["n_erased"] == insert.cache_n + insert.prefilled_n  # the partial prompt, not the document
