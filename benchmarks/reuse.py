"""Prompt reuse: how long the server spends on a prompt it has (partly) seen, and how much it re-processes.

A perfect cache re-processes only the tokens after the longest prefix it has
already seen (``ideal``): one token for a resend, the new question for a re-ask,
the half after the edit for a mid-document edit.
"""

from . import common


class FirstLoad(common.SessionFigures):
    """Cold prefill of document + question on a fresh server: the baseline of every reuse figure."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    unit = "seconds"
    version = "1"

    def track_prompt_seconds(self, cache, size, variant):
        return common.figure(cache, size, variant, "first_load/cold", "prompt_seconds")

    def track_ttft_seconds(self, cache, size, variant):
        return common.figure(cache, size, variant, "first_load/cold", "ttft_seconds")


class ReusedPromptSeconds(common.SessionFigures):
    """Time for each reuse step; with a perfect cache, a small fraction of the first load."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "seconds"
    version = "1"

    def track_prefill_seconds(self, cache, size, variant, step):
        return common.figure(cache, size, variant, step, "prompt_seconds")

    def track_ttft_seconds(self, cache, size, variant, step):
        return common.figure(cache, size, variant, step, "ttft_seconds")


class ReprocessedTokens(common.SessionFigures):
    """Prompt tokens the server evaluated again, and how many more than a perfect cache would."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "tokens"
    version = "1"

    def track_reprocessed_tokens(self, cache, size, variant, step):
        return common.figure(cache, size, variant, step, "reprocessed_tokens")

    def track_excess_over_ideal(self, cache, size, variant, step):
        return common.figure(cache, size, variant, step, "excess_tokens")
