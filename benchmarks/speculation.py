"""Speculative decoding: what the server drafted and accepted for each step's answer, and its decode seconds.

A variant that speculates (``--spec-type`` other than none, or a draft model) drafts tokens and verifies them
with the target in one batch; the drafts it accepts are tokens it did not decode one by one. n/a on a variant
that does not speculate. A llama.cpp change that breaks a hybrid's rollback shows here as a count, beside the
re-processed tokens (``reuse.ReprocessedTokens``) and the outputs (``correctness.ReusedOutputMismatch``).
"""

from . import common


class Speculation(common.SessionFigures):
    """Tokens drafted, and of them accepted, for the answer of each reuse step (n/a without speculation), the drafts
    with a token rejected (each one a rollback of the server's state), and the seconds spent generating it: what
    speculation is meant to shorten."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "tokens"
    version = "1"

    track_drafted_tokens = common.track("drafted_tokens")
    track_accepted_tokens = common.track("accepted_tokens")
    track_rolled_back_drafts = common.track("rolled_back_drafts", unit="drafts")
    track_decode_seconds = common.track("decode_seconds", unit="seconds")
