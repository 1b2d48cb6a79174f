"""The probe of speculative decoding (``--spec-type``): does the server draft, and how does it undo a draft?

A prompt that repeats a passage the model has just generated is what the n-gram kinds draft from (and what any
drafter predicts well), so the probe generates an answer to a fresh prompt, then sends prompt, answer and prompt
again: a speculating server drafts the answer's tokens and accepts them. The server's timings count what it
drafted and accepted; its start-up log says whether the recurrent state can roll a rejected draft back
(``n_rs_seq``) or whether a speculative checkpoint undoes it (docs/llama-server-reuse.md, speculative decoding).
"""

from __future__ import annotations

from reusebench.check.context import ProbeContext
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict

ANSWER_TOKENS = 48  # long enough for an n-gram drafter's lookup (ngram-mod matches 24 tokens by default)
PASSAGE_TOKENS = 256


def probe_spec_type(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    if str(setting.value) == "none":
        return [setting.verdict(Verdict.ACTIVE, "speculation off, as set")]
    passage = ctx.prompt(PASSAGE_TOKENS)
    answer = ctx.client.complete(passage, n_predict=ANSWER_TOKENS, n_probs=1, whole=True)
    again = ctx.client.complete([*passage, *answer.tokens, *passage[len(ctx.bos):]], n_predict=ANSWER_TOKENS,
                                n_probs=1, whole=True)
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
    return [setting.verdict(Verdict.ACTIVE, *evidence)]
