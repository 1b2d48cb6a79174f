"""One rule for "is the reused output the same?", and the bookkeeping of no-reuse references."""

from __future__ import annotations

from reusebench.llama.client import Completion, TokenProbs
from reusebench.records import Record
from reusebench.reuse.verification import (
    LOGPROB_TOLERANCE,
    References,
    common_prefix,
    max_logprob_delta,
    output_difference,
    token_difference,
)

MEASURED_CPU_NOISE = 3e-5  # the largest logprob difference between a reused and a cold computation on CPU


def completion(tokens: list[int], logprobs: list[float] | None = None,
               top: list[tuple[tuple[int, float], ...]] | None = None) -> Completion:
    logprobs = logprobs or [-1.0] * len(tokens)
    top = top or [((t, lp),) for t, lp in zip(tokens, logprobs)]
    probs = [TokenProbs(id=t, logprob=lp, top=alternatives) for t, lp, alternatives in zip(tokens, logprobs, top)]
    return Completion(prompt_n=10, cache_n=0, prompt_ms=1.0, predicted_n=len(tokens), predicted_ms=1.0,
                      tokens_evaluated=10, id_slot=0, ttft_ms=None, wall_ms=1.0, tokens=tokens, probs=probs)


def record(step: str, role: str = "measure", prompt_hash: str = "p") -> Record:
    return Record(run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=1,
                  scenario="resend", step=step, role=role, endpoint="/completion", started_at=0.0, ended_at=0.0,
                  prompt_hash=prompt_hash, lora="default")


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_token_ids_and_lengths_decide_first() -> None:
    assert token_difference(completion([1, 2, 3]), completion([1, 2, 3])) is None
    assert output_difference(completion([1, 2, 3]), completion([1, 5, 3])) == "token 1: id 2 != reference id 5"
    assert output_difference(completion([1, 2]), completion([1, 2, 3])) == "length 2 != reference 3"


def test_batching_noise_is_the_same_output() -> None:
    noisy = completion([1, 2], [-1.0, -2.0 + MEASURED_CPU_NOISE])
    assert output_difference(noisy, completion([1, 2], [-1.0, -2.0])) is None
    assert max_logprob_delta(noisy, completion([1, 2], [-1.0, -2.0])) < LOGPROB_TOLERANCE


def test_a_logprob_shift_below_a_token_flip_is_a_difference() -> None:
    # the old `run` tolerance (0.05) called this "same"
    shifted = completion([1, 2], [-1.0, -2.02])
    difference = output_difference(shifted, completion([1, 2], [-1.0, -2.0]))
    assert difference is not None and difference.startswith("token 1: logprob of id 2 -2.02000 != reference -2.00000")
    # the noise of a correct 32K partial reuse on pure attention (b11434, CPU) is the same output
    assert output_difference(completion([1], [-6.33580]), completion([1], [-6.33472])) is None


def test_top_k_alternatives_count_only_when_both_list_them() -> None:
    reference = completion([1], top=[((1, -0.1), (7, -3.0))])
    assert output_difference(completion([1], top=[((1, -0.1), (8, -1.0))]), reference) is None  # 8 only here
    differs = output_difference(completion([1], top=[((1, -0.1), (7, -2.9))]), reference)
    assert differs is not None and "id 7" in differs


def test_a_step_waits_for_its_reference_and_is_verified_by_it() -> None:
    references: References[str] = References()
    measured = record("resend")
    references.verify(measured, completion([1, 2]), "how to ask")
    assert measured.extra["reference"] == "deferred" and measured.matches_reference is None
    assert [pending.request for pending in references.waiting()] == ["how to ask"]
    cold = record("resend", role="reference")
    assert references.add(cold, completion([1, 3])) == [measured]
    assert measured.matches_reference is False and measured.mismatch == "token 1: id 2 != reference id 3"
    assert cold.extra["verifies"][0]["by"] == "resend/resend (reference)"
    assert references.waiting() == []


def test_a_later_step_with_the_same_prompt_shares_the_known_reference() -> None:
    references: References[str] = References()
    references.add(record("first load"), completion([4, 5]))
    again = record("resend")
    references.verify(again, completion([4, 5]), "unused")
    assert again.matches_reference is True and references.waiting() == []
    other_prompt = record("edit", prompt_hash="q")
    references.verify(other_prompt, completion([4, 5]), "ask q")
    assert other_prompt.extra["reference"] == "deferred"
