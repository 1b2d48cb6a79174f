"""One rule for "is the reused output the same?" (teacher-forced, against a measured noise band), and the
bookkeeping of no-reuse references."""

from __future__ import annotations

import math

from reusebench.llama.client import Completion, TokenProbs
from reusebench.llama.outputs import common_prefix, difference
from reusebench.records import Record
from reusebench.reuse.verification import (
    IDENTICAL,
    NOISE_FLOOR,
    NOISE_MARGIN,
    WITHIN_NOISE,
    WRONG,
    References,
    alternative_ubatch,
    judge,
)


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


def test_the_same_tokens_and_numbers_are_identical() -> None:
    found = difference(completion([1, 2, 3]), completion([1, 2, 3]))
    assert (found.identical, found.delta, found.first_token, found.compared) == (True, 0.0, None, 3)
    assert judge(found, None) == IDENTICAL  # no band is needed for an identical output


def test_the_difference_is_in_probability_so_a_rare_token_s_logprob_moves_nothing() -> None:
    # A top-5 tail token at p = 1e-5 moving by half a nat is 6.5e-6 of probability, 1.3e-5 of the top token's 0.5:
    # real weights do that with the batch shape. The chosen token at p = 0.5 moving to 0.45 is 0.05 / 0.5 = 0.1.
    rare = completion([1], top=[((1, math.log(0.5)), (9, math.log(1e-5) + 0.5))])
    reference = completion([1], top=[((1, math.log(0.5)), (9, math.log(1e-5)))])
    assert abs(difference(rare, reference).delta - 1e-5 * (math.exp(0.5) - 1) / 0.5) < 1e-12
    moved = completion([1], [math.log(0.45)])
    assert abs(difference(moved, completion([1], [math.log(0.5)])).delta - 0.1) < 1e-12


def test_a_draft_s_accepted_token_without_probabilities_compares_by_its_id_only() -> None:
    # speculation: the server gives an accepted draft token no alternatives and a placeholder logprob 0 (p = 1);
    # against the reference's real 0.5 that would read as a difference of 0.5 / 1 that reuse did not make
    drafted = completion([1, 2], [math.log(0.5), 0.0], top=[((1, math.log(0.5)),), ()])
    found = difference(drafted, completion([1, 2], [math.log(0.5), math.log(0.5)]))
    assert (found.delta, found.first_token, found.compared) == (0.0, None, 2)
    assert not found.identical and judge(found, 0.0) == WITHIN_NOISE  # not claimed identical: not all was shown
    wrong_id = difference(completion([1, 3], [math.log(0.5), 0.0], top=[((1, math.log(0.5)),), ()]),
                          completion([1, 2], [math.log(0.5), math.log(0.5)]))
    assert wrong_id.first_token == 1 and judge(wrong_id, 0.0) == WRONG  # a flip no probability shows as a near-tie


def test_outputs_are_compared_up_to_the_first_differing_token_and_not_after() -> None:
    # Position 1 flips a near-tie (0.50 against 0.48); position 2 continues from other text and is left out.
    got = completion([1, 2, 3], [-0.1, math.log(0.50), -5.0],
                     top=[((1, -0.1),), ((2, math.log(0.50)), (4, math.log(0.48))), ((3, -5.0),)])
    reference = completion([1, 4, 8], [-0.1, math.log(0.49), -0.01],
                           top=[((1, -0.1),), ((4, math.log(0.49)), (2, math.log(0.47))), ((8, -0.01),)])
    found = difference(got, reference)
    assert (found.identical, found.first_token, found.compared) == (False, 1, 2)
    assert abs(found.delta - 0.06) < 1e-9  # token 2: 0.50 against 0.47, over the top 0.50
    assert found.describe() == "tokens differ from position 1; largest difference 0.06 of the top probability over 2 position(s)"


def test_a_token_one_list_lacks_counts_at_least_the_gap_to_that_list_s_least_likely() -> None:
    # 7 is 0.3 likely in the reused output and absent from the reference's top 2, whose least likely is 0.1:
    # it differs by at least 0.2 there, 1/3 of the top token's 0.6.
    got = completion([1], top=[((1, math.log(0.6)), (7, math.log(0.3)))])
    reference = completion([1], top=[((1, math.log(0.6)), (5, math.log(0.1)))])
    assert abs(difference(got, reference).delta - 0.2 / 0.6) < 1e-9


def test_different_lengths_differ_where_one_output_ends() -> None:
    found = difference(completion([1, 2]), completion([1, 2, 3]))
    assert (found.identical, found.first_token) == (False, 2)


def test_judged_against_the_noise_band() -> None:
    found = difference(completion([1], [math.log(0.45)]), completion([1], [math.log(0.5)]))  # 0.05 / 0.5 apart
    assert judge(found, None) is None  # not identical: it waits for a band
    assert judge(found, 0.1 / NOISE_MARGIN) == WITHIN_NOISE
    assert judge(found, 0.1 / NOISE_MARGIN - 1e-6) == WRONG
    assert judge(found, 0.0) == WRONG  # a build whose batch shapes give the same numbers allows only the floor
    last_bits = difference(completion([1], [math.log(0.5) + 1e-8]), completion([1], [math.log(0.5)]))
    assert judge(last_bits, 0.0) == WITHIN_NOISE and last_bits.delta < NOISE_FLOOR


def test_the_band_s_second_computation_runs_at_an_odd_ubatch_near_a_quarter() -> None:
    assert [alternative_ubatch(n) for n in (512, 64, 16, 12, 2)] == [127, 15, 3, 3, 1]


def test_a_step_waits_for_its_reference_then_for_its_noise_band() -> None:
    references: References[str] = References()
    measured = record("resend")
    references.verify(measured, completion([1, 2], [-1.0, math.log(0.45)]), "how to ask")
    assert measured.extra["reference"] == "deferred" and measured.matches_reference is None
    assert [pending.request for pending in references.waiting()] == ["how to ask"]
    cold = record("resend", role="reference")
    assert references.add(cold, completion([1, 2], [-1.0, math.log(0.5)])) == [measured]
    # compared, not identical: no verdict until the band is known
    assert measured.matches_reference is None and measured.extra["output_check"] is None
    assert cold.extra["verifies"][0]["by"] == "resend/resend (reference)"
    assert references.waiting() == [] and [u.request for u in references.unjudged()] == ["how to ask"]
    [(waiting, checks)] = references.settle(0.03)  # 0.1 apart: more than 3 bands of 0.03
    assert waiting.reference.probs[1].logprob == math.log(0.5)
    assert (measured.matches_reference, measured.extra["output_check"], measured.extra["noise_band"]) == (
        False, WRONG, 0.03)
    assert measured.mismatch == "same tokens; largest difference 0.1 of the top probability over 2 position(s)"
    assert checks[0]["output_check"] == WRONG and references.unjudged() == []


def test_a_later_step_with_the_same_prompt_shares_the_known_reference() -> None:
    references: References[str] = References()
    references.add(record("first load"), completion([4, 5]))
    again = record("resend")
    references.verify(again, completion([4, 5]), "unused")
    assert (again.matches_reference, again.extra["output_check"]) == (True, IDENTICAL)
    assert references.waiting() == [] and references.unjudged() == []
    other_prompt = record("edit", prompt_hash="q")
    references.verify(other_prompt, completion([4, 5]), "ask q")
    assert other_prompt.extra["reference"] == "deferred"
