"""Report A's six steps on a real llama-server with generated tiny models, at 2K tokens.

The hybrid (Gated DeltaNet + attention) must show report A's pattern: resend 4,
re-ask 515 + the question, mid-document edit everything, interleave-and-return 4,
restore after restart everything; the pure-attention control must not.
"""

from __future__ import annotations

import pytest

from reusebench.records import Record

from conftest import REPORT_A_SIZE, report_a

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Record]:
    return report_a("tiny-qwen35", "mmproj=off,cache-reuse=0", tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Record]:
    return report_a("tiny-llama", "default", tmp_path_factory.mktemp("results"))


def test_first_load_processes_the_whole_prompt(hybrid):
    cold = hybrid[("first_load", "cold")]
    assert cold.cache_n == 0
    assert cold.prompt_n == cold.prompt_tokens
    assert abs(cold.prompt_tokens - REPORT_A_SIZE) / REPORT_A_SIZE < 0.02  # the document plus the question


def test_hybrid_resend_returns_to_the_checkpoint_4_tokens_before_the_end(hybrid):
    assert hybrid[("resend", "same prompt")].prompt_n == 4


def test_hybrid_reask_goes_back_n_ubatch_plus_4_tokens(hybrid):
    cold, reask = hybrid[("first_load", "cold")], hybrid[("reask", "new question")]
    # The cold prompt's second-last checkpoint sits 4 + n_ubatch (512) tokens before its end; the re-ask (the
    # document and another question) re-processes from there: prompt_tokens - (cold prompt_tokens - 516).
    assert reask.prompt_n == reask.expected == reask.prompt_tokens - (cold.prompt_tokens - 516)
    assert reask.verdict == "partial"
    assert "checkpoint" in reask.cause["summary"]


def test_hybrid_mid_document_edit_reprocesses_everything(hybrid):
    edit = hybrid[("edit_middle", "line at 50%")]
    assert edit.cache_n == 0 and edit.prompt_n == edit.prompt_tokens
    assert edit.ideal < edit.prompt_tokens * 0.6  # a perfect cache would keep the first half
    assert edit.verdict == "miss"


def test_hybrid_interleave_and_return_is_served_from_ram(hybrid):
    back = hybrid[("interleave", "back to first")]
    assert back.prompt_n == back.expected == 4  # from the checkpoint 4 tokens before the end
    assert "RAM" in back.cause["summary"]


def test_hybrid_restore_after_restart_reuses_only_a_strict_extension(hybrid):
    assert hybrid[("restore_disk", "resend")].cache_n == 0
    assert hybrid[("restore_disk", "reask")].cache_n == 0
    extension = hybrid[("restore_disk", "extension")]
    # the extension appends to exactly what the saved slot held: the appended tokens (the ideal) are processed, and
    # one more, the last generated token, which was sampled but never decoded into the saved state
    assert extension.prompt_n == extension.expected == extension.ideal + 1
    assert extension.cache_n > REPORT_A_SIZE


def test_reused_output_equals_output_without_reuse(hybrid, control):
    reused = [r for r in [*hybrid.values(), *control.values()] if r.cache_n]
    assert reused and all(r.matches_reference is True for r in reused)


def test_control_reuses_up_to_the_edit_and_restores_from_disk(control):
    assert control[("resend", "same prompt")].prompt_n == 1
    edit = control[("edit_middle", "line at 50%")]
    assert edit.prompt_n == edit.ideal  # exactly the tokens after the inserted line
    assert control[("restore_disk", "resend")].prompt_n == 1
    assert control[("restore_disk", "reask")].prompt_n == control[("restore_disk", "reask")].ideal
