"""The prefill budget: every prompt token the suite makes the server prefill, against what the measured steps
themselves required; deferred and shared references; and the harness's own cost, at 2K on the real server.

Measured here (2-core CPU, 2K tokens, whole catalogue): the hybrid (granitehybrid-longmem, cache-reuse 256)
2.25 with verification (2.09 before the re-ask's reference moved before the restart, which then no longer serves
as it) and 1.16 without; the pure-attention control 3.51 and 1.23. Verification costs one
full prefill per distinct reused prompt, while a good cache makes the measured steps cheap: the better the
cache, the higher the ratio, so the 1.25 target is out of reach without skipping verification (see the
bounds asserted below). Without verification, the only extra prefill left is the interleave scenario's other
document (a setup call): 1.16 / 1.23 with it, ~1.00 if it counted as a measured cold load.
"""

from __future__ import annotations

import io
import statistics
import sys
from pathlib import Path

import pytest

from reusebench import records
from reusebench.budget import PrefillBudget, prefill_budgets
from reusebench.config import profiles
from reusebench.records import Record, Role
from reusebench.run import runner
from reusebench.run.selection import Selection

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
SIZE = 2048


def run(profile: str, results: Path, verify: bool) -> tuple[runner.ProfileResult, str]:
    out = io.StringIO()
    result = runner.run_profile(profiles.load_profile(profile), Selection(sizes=(SIZE,), verify=verify),
                                results_dir=results, out=out)
    assert result.failed_sessions == 0, out.getvalue()
    return result, out.getvalue()


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[runner.ProfileResult, str]:
    return run("tiny-granitehybrid-longmem", tmp_path_factory.mktemp("results"), verify=True)


@pytest.fixture(scope="module")
def hybrid_unverified(tmp_path_factory: pytest.TempPathFactory) -> tuple[runner.ProfileResult, str]:
    return run("tiny-granitehybrid-longmem", tmp_path_factory.mktemp("results"), verify=False)


def step(result: runner.ProfileResult, scenario: str, name: str, role: str = "measure") -> Record:
    (found,) = [r for r in result.records if (r.scenario, r.step, r.role) == (scenario, name, role)]
    return found


def budget(result: runner.ProfileResult) -> PrefillBudget:
    (only,) = prefill_budgets(result.records)
    return only


def test_the_budget_counts_every_prefilled_token_and_is_printed_per_session(hybrid):
    result, output = hybrid
    b = budget(result)
    # the noise band's computations are not the session's cost, and are counted apart
    calls = [r for r in result.records if r.prompt_n is not None and r.role != Role.NOISE]
    assert b.total == sum(r.prompt_n for r in calls)
    assert b.measured == sum(r.prompt_n for r in calls if r.role == Role.MEASURE)
    assert b.setup == step(result, "interleave", "other document", "setup").prompt_n + sum(
        r.prompt_n for r in calls if r.scenario == "probe_eviction" and r.role == Role.SETUP)
    (summary,) = [r for r in result.records if r.role == records.Role.SESSION]
    assert summary.extra["prefill"] == {"measure": b.measured, "setup": b.setup, "reference": b.reference,
                                        "needed": b.measured}  # at 2K no step is long enough to stop early
    assert output.rstrip().splitlines()[-1] == b.line()  # the run ends with one budget line per session
    noise = [r for r in result.records if r.role == Role.NOISE]
    if noise:  # measured when a reused output was not identical: said beside the budget, not in it
        assert summary.extra["noise"]["tokens"] == sum(r.prompt_n for r in noise)
        assert "tokens at ubatch 127, not in the budget)" in output  # 512 odd, near a quarter
    assert f"prefill budget {b.ratio:.2f}" in output
    # One reference per distinct reused prompt, none for prompts some call computed without reuse:
    # 2.25 measured on this machine; the bound leaves room for a build that reuses differently.
    assert b.ratio is not None and 1.9 < b.ratio < 2.5


def test_a_reused_step_is_judged_before_a_restart_forgets_its_state(hybrid):
    result, output = hybrid
    reask = step(result, "reask", "new question")
    assert reask.extra["reference"] == "deferred"  # written before it was verified ...
    assert reask.matches_reference is True and reask.verdict == "partial"  # ... the reader applied the verdict
    assert reask.extra["verified_by"] == "reask/new question (reference)"
    (reference,) = [r for r in result.records if r.role == Role.REFERENCE and r.prompt_hash == reask.prompt_hash]
    # judged as soon as the state it overwrites is not needed: before restore_disk's restart, not at the end
    restored = step(result, "restore_disk", "resend")
    assert reask.ended_at < reference.started_at < restored.started_at
    # the re-ask after the restore computes the same prompt cold: already judged, no second reference
    assert step(result, "restore_disk", "reask").cache_n == 0
    # D + Q1 was computed cold by the first load: resend and interleave share it, no reference call
    first = step(result, "first_load", "cold")
    assert not [r for r in result.records if r.role == Role.REFERENCE and r.prompt_hash == first.prompt_hash]
    assert step(result, "resend", "same prompt").matches_reference is True
    assert reask.extra["output_check"] in ("identical", "within noise")
    said = "is identical to" if reask.extra["output_check"] == "identical" else "differs, waiting for the noise band, from"
    assert (f"reask/new question (partial): its output {said} the no-reuse output of reask/new question (reference), "
            "computed later") in output


def test_deferred_references_run_before_a_restart_or_at_the_end_and_carry_their_verdicts(hybrid):
    result, _ = hybrid
    references = [r for r in result.records if r.role == Role.REFERENCE]
    restarted = step(result, "restore_disk", "resend").started_at
    last_measured = max(r.ended_at for r in result.records if r.role == Role.MEASURE)
    assert references and all(r.started_at < restarted or r.started_at > last_measured for r in references)
    assert all(len(r.extra["verifies"]) >= 1 for r in references)
    cut = step(result, "chunk_removed", "10% cut at 10%")
    assert cut.verdict == "WRONG OUTPUT" and cut.mismatch  # a chunk shifted over a hybrid still caught, now from the deferred reference
    text = (result.run_dir / "records.jsonl").read_text()
    assert '"matches_reference":null' in text  # the measured line itself was written unverified (append-only)


def test_without_verification_only_setup_prefills_are_extra(hybrid_unverified):
    result, _ = hybrid_unverified
    b = budget(result)
    assert b.reference == 0
    assert b.setup == step(result, "interleave", "other document", "setup").prompt_n + 25  # + probe_eviction's setup
    assert 1.10 < b.ratio < 1.20  # 1.16: the other document is the only real extra prefill


def test_harness_figures_for_asv(hybrid, monkeypatch):
    result, _ = hybrid
    sys.path.insert(0, str(REPO))
    from benchmarks import common, harness

    cache = common.summarise(result.records, [str(result.records_path)], failed_sessions=0)
    variant, size = "default", "2K"
    ratio = harness.PrefillBudget().track_prefill_budget_ratio(cache, size, variant)
    assert ratio == pytest.approx(budget(result).ratio)
    assert harness.PrefillBudget().track_extra_prefill_tokens(cache, size, variant) == budget(result).extra
    # the seconds are the session's own, read back from its summary record; how many is the CPU's business
    (timing,) = [r.extra["timing"] for r in result.records if r.role == Role.SESSION]
    overhead = harness.HarnessOverhead()
    assert overhead.track_overhead_seconds(cache, size, variant) == timing["overhead_s"] > 0
    assert overhead.track_overhead_percent(cache, size, variant) == 100 * timing["overhead_s"] / timing["wall_s"]
    # the client's wait for the first token spans the server's prompt time
    gaps = [(r.ttft_ms - r.prompt_ms) / 1000 for r in result.records
            if r.ttft_ms is not None and r.prompt_ms is not None and not r.error]
    assert overhead.track_ttft_minus_prompt_seconds(cache, size, variant) == statistics.median(gaps) > 0
    assert harness.CorpusBuilding().track_corpus_tokenizer_calls(cache, size, variant) == 6  # 3 per document
    assert harness.CorpusBuilding().track_corpus_seconds(cache, size, variant) == timing["corpus_s"] > 0
