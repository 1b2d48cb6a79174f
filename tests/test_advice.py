"""`reusebench advise` without a server: the reuse model's predictions it prints, and how trials are compared.
The trials themselves run in tests/test_advice_e2e.py against the real server."""

from __future__ import annotations

import re

import pytest

from reusebench.advise import advice
from reusebench.capability import PINNED
from reusebench.records import Record
from reusebench.reuse.server_inputs import Memory, launch_of_options

HYBRID = Memory("hybrid", can_shift=False)
LAUNCH = launch_of_options({"parallel": 1, "ubatch-size": 512, "batch-size": 2048, "ctx-checkpoints": 32})
DELIMITER, QUESTION = [10, 11], [20] * 17


def test_user_messages_bring_a_mid_document_edit_down_to_the_message_before_it() -> None:
    document = list(range(1000, 3048))
    cost = advice.predicted_edit_cost(HYBRID, LAUNCH, PINNED, document, DELIMITER, QUESTION, 256)
    assert cost.plain == 1 + len(document) + advice.EDIT_TOKENS + len(QUESTION)  # everything
    # the edit sits at document token 1024, i.e. inside the 5th message; checkpoints every other message start
    assert cost.messages < cost.plain // 2 + 2 * 258 and cost.messages > cost.plain // 2 - 258
    assert cost.checkpoints >= 4


def test_at_128k_messages_of_2048_need_more_than_32_checkpoints_and_4096_fit() -> None:
    document = list(range(1000, 1000 + 131072))
    # 65 message checkpoints: the 32 newest start past the edit at 50%, so it re-processes everything
    crowded = advice.predicted_edit_cost(HYBRID, LAUNCH, PINNED, document, DELIMITER, QUESTION, 2048)
    assert crowded.messages > crowded.plain and crowded.checkpoints == 32
    fits = advice.predicted_edit_cost(HYBRID, LAUNCH, PINNED, document, DELIMITER, QUESTION, 4096)
    assert fits.messages < 65536 + 2 * 4096
    assert advice.advised_min_step(HYBRID, LAUNCH, PINNED, 131072) == 4096
    assert advice.advised_min_step(HYBRID, LAUNCH, PINNED, 32768) == 2048


def test_the_document_as_user_messages() -> None:
    assert advice.as_user_messages([1, 2, 3, 4, 5], [9], 2) == [9, 1, 2, 9, 3, 4, 9, 5]
    assert advice.edited(list(range(20))) == [*range(10), *range(8), *range(10, 20)]


def measured(variant: str, step: str, prompt_n: int, same: bool | None = True) -> Record:
    scenario, _, name = step.partition("/")
    return Record(run_id="r", session="s", profile="p", variant=variant, build="b", model="m", size=2048,
                  scenario=scenario, step=name, role="measure", endpoint="/completion", started_at=0.0, ended_at=0.0,
                  prompt_n=prompt_n, matches_reference=same)


def test_trials_with_and_without_an_option_are_compared_step_by_step() -> None:
    recorded = [measured("a", "first_load/cold", 2066), measured("b", "first_load/cold", 2066),
                measured("a", "resend/same prompt", 4), measured("b", "resend/same prompt", 4),
                measured("a", "chunk_removed/cut", 300, same=False), measured("b", "chunk_removed/cut", 1860)]
    assert advice.compare_steps(recorded, "a", "b") == {
        "resend/same prompt": (4, 4, True, True), "chunk_removed/cut": (300, 1860, False, True)}


def test_advice_says_whether_it_was_measured_or_predicted() -> None:
    text = advice.render({"v": [advice.Advice("cache-reuse 256", "DISABLED: remove it; nothing changes", "measured")],
                          "w": []})
    assert text == "v:\n- cache-reuse 256: DISABLED: remove it; nothing changes [measured]\n\nw:\n- nothing to change"


@pytest.mark.e2e
def test_advise_tiny_qwen35_removes_its_disabled_cache_reuse_and_splits_the_document(tmp_path, capsys) -> None:
    from reusebench import cli

    status = cli.main(["advise", "--profile", "tiny-qwen35", "--variant", "mmproj=off,cache-reuse=256",
                       "--results", str(tmp_path)])
    printed = capsys.readouterr().out
    assert status == 0
    assert ("- cache-reuse 256: DISABLED on this model (this model's attention cache cannot shift): remove it; "
            "nothing changes (re-processed tokens equal with and without it on 4 steps at 2K) [measured]") in printed
    (split,) = [line for line in printed.splitlines() if line.startswith("- checkpoint-min-step")]
    assert "[measured at 2K, predicted at the profile's sizes]" in split
    plain, messages = (int(n.replace(",", "")) for n in re.findall(
        r"at 2K a one-line edit at 50% re-processes ([\d,]+) tokens; as user messages of 256 tokens with "
        r"checkpoint-min-step 256, ([\d,]+)", split)[0])
    assert plain > 2048 and messages < plain // 2 + 600
    assert "at 128K with checkpoint-min-step 4096" in split
