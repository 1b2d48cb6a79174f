"""The agreement table from records (no server): counts per profile x option set x size, and the disagreements."""

from __future__ import annotations

from pathlib import Path

from reusebench.advise import agreement
from reusebench.config import profiles
from reusebench.records import Record


def step(profile: str, size: int, scenario: str, prompt_n: int, expected: int | None, **fields: object) -> Record:
    return Record(run_id="r", session="s", profile=profile, variant="default", build="b", model="tiny:x", size=size,
                  scenario=scenario, step="x", role=fields.pop("role", "measure"), endpoint="/completion",  # type: ignore[arg-type]
                  started_at=0.0, ended_at=0.0, prompt_n=prompt_n, expected=expected,
                  cause_expected="restored checkpoint at n_tokens=1550", cause={"summary": "forced full re-processing"},
                  **fields)  # type: ignore[arg-type]


def test_agreements_are_counted_per_profile_option_set_and_size_and_disagreements_listed() -> None:
    recorded = [
        step("tiny-qwen35", 2048, "resend", 4, 4),
        step("tiny-qwen35", 2048, "reask", 2066, 515),
        step("tiny-qwen35", 2048, "interleave", 2066, 2066, role="setup"),  # not measured: not counted
        step("tiny-qwen35+ctx-checkpoints=1", 2048, "reask", 2066, 2066),
        step("tiny-qwen35", 8192, "resend", 4, 4),
        step("tiny-qwen35", 8192, "edit_middle", 0, None, error="server died"),  # failed: not counted
        step("tiny-granitehybrid-longmem", 2048, "chunk_removed", 300, 300, matches_reference=False,
             extra={"expected_wrong_output": True}),
        step("tiny-lora", 2048, "lora_swap", 4, 4, matches_reference=False),
        step("tiny-lora", 4096, "lora_swap", 4, 4, matches_reference=True, extra={"foreign_reused": 2000,
                                                                               "expected_wrong_output": True}),
        step("tiny-glm", 4096, "chunk_removed", 9, 9, extra={"expected_wrong_output": True}),  # not verified
    ]
    assert agreement.tally(recorded) == [
        agreement.Tally("tiny-qwen35", "defaults", 2048, 1, 2),
        agreement.Tally("tiny-qwen35", "ctx-checkpoints=1", 2048, 1, 1),
        agreement.Tally("tiny-qwen35", "defaults", 8192, 1, 1),
        agreement.Tally("tiny-granitehybrid-longmem", "defaults", 2048, 1, 1),
        agreement.Tally("tiny-lora", "defaults", 2048, 1, 1),
        agreement.Tally("tiny-lora", "defaults", 4096, 1, 1),
        agreement.Tally("tiny-glm", "defaults", 4096, 1, 1),
    ]
    text = agreement.render(recorded)
    assert "| tiny-qwen35                | defaults          | 1/2  |      | 1/1  |" in text
    assert "agree: 7 of 8 measured steps (tolerance 0 tokens)" in text
    assert "wrong output or foreign reuse, on 3 checked steps: predicted 2, measured 3, both 2" in text
    assert "- measured, not predicted: tiny-lora [default] @ 2K lora_swap/x" in text
    assert "tiny-glm [default] @ 4K chunk_removed" not in text
    assert ("- tiny-qwen35 [default] @ 2K reask/x: expected 515 (restored checkpoint at n_tokens=1550), "
            "measured 2,066 (forced full re-processing)") in text


def test_an_option_set_is_a_profile_extending_the_shipped_one(tmp_path: Path) -> None:
    path = agreement.derived_profile(tmp_path, "tiny-granitehybrid", "ctx-checkpoints=1")
    profile = profiles.load_profile(path, check_binary=False)
    assert agreement.split_profile(profile.name) == ("tiny-granitehybrid", "ctx-checkpoints=1")
    (variant,) = profile.variants
    assert variant.option("ctx-checkpoints") == 1 and variant.option("parallel") == 1  # tiny-base's, inherited
