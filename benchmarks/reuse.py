"""Prompt reuse: how long the server spends on a prompt it has (partly) seen, and how much it re-processes.

A perfect cache re-processes only the tokens after the longest prefix it has
already seen (``ideal``): one token for a resend, the new question for a re-ask,
the half after the edit for a mid-document edit. What this build of llama-server
should re-process by its own rules (``expected``) comes from the reuse model,
``reusebench.reuse.expectation``.
"""

from . import common


class FirstLoad(common.SessionFigures):
    """Cold prefill of document + question on a fresh server: the baseline of every reuse figure."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    unit = "seconds"
    version = "2"  # 2: track_prompt_seconds renamed track_prefill_seconds, as in StepSeconds

    track_prefill_seconds = common.track("prefill_seconds", common.FIRST_LOAD)
    track_ttft_seconds = common.track("ttft_seconds", common.FIRST_LOAD)


class StepSeconds(common.SessionFigures):
    """Time for each reuse step; with a perfect cache, a small fraction of the first load."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "seconds"
    version = "2"  # 2: was ReusedPromptSeconds

    track_prefill_seconds = common.track("prefill_seconds")
    track_ttft_seconds = common.track("ttft_seconds")


class ReprocessedTokens(common.SessionFigures):
    """Prompt tokens the server evaluated again, and how many more than a perfect cache would."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "tokens"
    version = "1"

    track_reprocessed_tokens = common.track("reprocessed_tokens")
    track_excess_over_ideal = common.track("excess_over_ideal")


class ExpectedTokens(common.SessionFigures):
    """Prompt tokens re-processed beyond what the reuse model expects of this build (measured - expected).

    0 while the server behaves as its rules say, at any document size; a llama.cpp change to a reuse rule
    moves it off 0 (e.g. to the whole prompt minus 516 when a re-ask loses its checkpoint).
    """

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "tokens"
    version = "1"

    track_deviation_from_expected = common.track("deviation_from_expected")
