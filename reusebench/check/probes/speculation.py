"""The probe of speculative decoding (``--spec-type``): does the server draft, and how does it undo a draft?

A prompt that repeats a passage the model has just generated is what the n-gram kinds draft from (and what any
drafter predicts well), so the probe generates an answer to a fresh prompt, then sends prompt, answer and prompt
again: a speculating server drafts the answer's tokens and accepts them. The server's timings count what it
drafted and accepted; its start-up log says whether the recurrent state can roll a rejected draft back
(``n_rs_seq``) or whether a speculative checkpoint undoes it (docs/llama-server-reuse.md, speculative decoding).

Greedy speculation must not change the answer: the drafts are verified by the target. The same prompt is answered
again without reuse, then by the server restarted with ``--spec-type none`` (b11434 takes no per-request speculation
settings); an answer that differs beyond the noise a change of batch size alone makes is UNSAFE: a rejected draft
left a wrong state behind.
"""

from __future__ import annotations

from reusebench.check.context import ProbeContext
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.reuse.verification import WRONG

ANSWER_TOKENS = 48  # long enough for an n-gram drafter's lookup (ngram-mod matches 24 tokens by default)
PASSAGE_TOKENS = 256


def probe_spec_type(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    if str(setting.value) == "none":
        return [setting.verdict(Verdict.ACTIVE, "speculation off, as set")]
    passage = ctx.prompt(PASSAGE_TOKENS)
    answer = ctx.client.complete(passage, n_predict=ANSWER_TOKENS, n_probs=1, whole=True)
    repeated = [*passage, *answer.tokens, *passage[len(ctx.bos):]]
    again = ctx.client.complete(repeated, n_predict=ANSWER_TOKENS, n_probs=1, whole=True)
    evidence = [f"a {PASSAGE_TOKENS}-token passage, the model's {len(answer.tokens)}-token answer and the passage "
                f"again: drafted {again.draft_n or 0}, accepted {again.draft_accepted or 0}"]
    if ctx.memory.needs_checkpoints:  # a recurrent state cannot be cut back at any position
        rolls = ctx.applied("n_rs_seq")
        evidence.append("log: n_rs_seq not stated" if rolls is None else
                        "log: n_rs_seq = 0: a rejected draft is undone from a speculative checkpoint" if rolls == 0
                        else f"log: n_rs_seq = {rolls}: the recurrent state rolls back up to {rolls} tokens")
    if not again.draft_n:
        return [setting.verdict(Verdict.INEFFECTIVE, *evidence, "nothing was drafted on a passage the model had "
                                                                "just read and answered")]
    outcome, output = _against_no_speculation(ctx, repeated)
    if outcome == WRONG:
        return [setting.verdict(Verdict.UNSAFE, *evidence, output)]
    if not again.draft_accepted:
        return [setting.verdict(Verdict.INEFFECTIVE, *evidence, output, "no draft was accepted: drafting costs time "
                                                                        "and saves none")]
    return [setting.verdict(Verdict.ACTIVE, *evidence, output)]


def _against_no_speculation(ctx: ProbeContext, prompt: list[int]) -> tuple[str, str]:
    """The answer to `prompt` without reuse, with speculation and from the server restarted without it: identical,
    within noise or WRONG (``ProbeContext.output_check``), and the evidence. The server is as launched after."""
    drafted = ctx.complete(prompt, cache_prompt=False, whole=True)
    ctx.handle.restart(("--spec-type", "none"))
    try:
        plain = ctx.complete(prompt, cache_prompt=False, whole=True)
    finally:
        ctx.handle.restart()
    outcome, words = ctx.output_check(drafted, plain, prompt, whole=True)
    return outcome, (f"the answer with speculation ({drafted.draft_accepted or 0} of {drafted.draft_n or 0} drafted "
                     f"tokens accepted) against the server without it (--spec-type none): {words}")
