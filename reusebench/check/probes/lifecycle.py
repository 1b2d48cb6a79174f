"""Probes that change what later probes see, so they run last: a slot saved, the server restarted and the slot
restored; the server left idle until it sleeps."""

from __future__ import annotations

import secrets
from pathlib import Path

from reusebench.check.context import QUESTION_TOKENS, ProbeContext, flag, of_kind, quote, timings
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.llama.client import ClientError, recorded_error
from reusebench.llama.outputs import common_prefix


def probe_slot_save_path(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Save a slot, restart, restore, then resend / re-ask / extend, restoring before each."""
    if setting.value is None:
        try:
            ctx.client.slot_erase(0)
        except ClientError as error:
            return [setting.verdict(Verdict.DISABLED, f"{recorded_error(error)} (action=erase)")]
        return [setting.verdict(Verdict.INEFFECTIVE, "slot actions answered without --slot-save-path")]
    document, (question, other_question) = ctx.prompt(ctx.doc_tokens), ctx.questions()
    prompt = document + question
    first = ctx.complete(prompt)
    slot, filename = first.id_slot or 0, f"reusebench-check-{secrets.token_hex(4)}.bin"
    follow_ups = {
        "resend after restart": prompt,
        "re-ask after restart": document + other_question,
        "strict extension after restart": prompt + first.tokens + ctx.fresh(QUESTION_TOKENS),
    }
    try:
        saved = ctx.client.slot_save(slot, filename)["n_saved"]
        ctx.handle.restart()
        verdicts = []
        for aspect, follow_up in follow_ups.items():
            restored = ctx.client.slot_restore(slot, filename)["n_restored"]
            mark = ctx.mark()
            reply = ctx.complete(follow_up, id_slot=slot)
            shared = common_prefix(prompt + first.tokens, follow_up)
            evidence = [f"saved {saved} tokens, restarted, restored {restored}; {reply.prompt_n + reply.cache_n}-token "
                        f"prompt sharing {shared}: {timings(reply)}",
                        *map(quote, of_kind(ctx.events_since(mark), "forced_full_reprocess", "checkpoint_restored"))]
            verdict = Verdict.ACTIVE if reply.cache_n >= shared // 2 else Verdict.INEFFECTIVE
            verdicts.append(setting.verdict(verdict, *evidence, aspect=aspect))
        return verdicts
    finally:
        (Path(str(setting.value)) / filename).unlink(missing_ok=True)


def probe_sleep_idle_seconds(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Let the server idle past the limit, watching it only through /props (which does not wake it)."""
    seconds = ctx.number(setting, "sleep-idle-seconds")
    if seconds < 0:
        slept = of_kind(ctx.events_since(0), "sleep_entering")
        evidence = (f"{seconds:g} never sleeps: /props is_sleeping={flag(ctx.client.props().get('is_sleeping'))}",
                    f"{len(slept)} 'entering sleeping state' line(s) during the check")
        return [setting.verdict(Verdict.INEFFECTIVE if slept else Verdict.DISABLED, *evidence)]
    prompt = ctx.prompt(ctx.doc_tokens)
    slot = ctx.complete(prompt).id_slot
    before = ctx.complete(prompt, id_slot=slot)
    mark = ctx.mark()
    waited = ctx.handle.wait_until_asleep(seconds)
    if not waited.asleep:
        return [setting.verdict(Verdict.INEFFECTIVE, f"/props is_sleeping=false after {waited.waited_s:.1f} s idle")]
    sleep_lines = [quote(e) for e in of_kind(ctx.events_since(mark), "sleep_entering")]
    # In the b11434 source /metrics does not wake a sleeping server, yet build 7e4c0a9 woke on it
    # (docs/llama-server-reuse.md, "Sleep"). Asked last, once the sleep is shown, so the answer is a finding
    # rather than a disturbance.
    ctx.client.metrics()
    woken_by_metrics = not ctx.client.props().get("is_sleeping")
    after = ctx.complete(prompt, id_slot=slot)
    survived = after.cache_n > len(prompt) // 2
    return [setting.verdict(
        Verdict.ACTIVE,
        f"/props is_sleeping=true after {waited.waited_s:.1f} s idle", *sleep_lines,
        f"finding: the caches {'survived' if survived else 'did not survive'} sleep: resend before sleep "
        f"{timings(before)}, after waking {timings(after)}",
        f"finding: GET /metrics {'woke' if woken_by_metrics else 'did not wake'} the sleeping server",
    )]
