"""The option probes: for each option, a small request or two that shows whether it is in effect.

Probes cost a few hundred to ~3K tokens (prompts of random words), not a prefill of the profile's
size, and they watch the server only through channels that do not change what they check:
``/props`` and ``/metrics`` (they do not wake a sleeping server; ``GET /slots`` does and is never
called), the completion timings and the ``-lv 4`` log. How llama-server reuses prompts, and why each
probe looks where it does: docs/llama-server-reuse.md.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from pathlib import Path

from reusebench.llama.client import ClientError, Completion
from reusebench.llama.facts import CHATML_USER_START, message_delimiters
from reusebench.llama.logs import Event
from reusebench.check.context import (
    PROBE_TAIL_TOKENS,
    QUESTION_TOKENS,
    Probe,
    ProbeContext,
    of_kind,
    quote,
    timings,
)
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.reuse.verification import common_prefix, output_difference

MAX_PROBE_PROMPT = 3072  # a probe that would need a longer prompt reports UNVERIFIED instead
# The --cache-reuse probe removes a chunk this far into the document, of this many tokens: chunk reuse then
# shifts what follows, which a recurrent state cannot follow (docs/llama-server-reuse.md, "--cache-reuse").
REUSE_CUT_AT = 64
REUSE_REMOVED = 32
MIN_STEP_MARGIN = 16  # user messages this far below and above --checkpoint-min-step


def _flag(value: object) -> str:
    return str(value).lower()


# --- probes: configuration the server reports ---------------------------------------------------------


def probe_parallel(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    props = ctx.client.props()
    evidence = [quote(e) for e in of_kind(ctx.startup, "n_parallel_auto", "slots_initialized")]
    evidence.append(f"/props total_slots={props['total_slots']}")
    expected = None if setting.value is None or int(setting.value) < 0 else int(setting.value)
    applied = props["total_slots"] == ctx.facts["n_slots"] and expected in (None, ctx.facts["n_slots"])
    return [setting.verdict(Verdict.ACTIVE if applied else Verdict.INEFFECTIVE, *evidence)]


def probe_kv_unified(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    n_ctx_slot = ctx.client.props()["default_generation_settings"]["n_ctx"]
    n_ctx = ctx.applied("n_ctx")
    evidence = [quote(e) for e in of_kind(ctx.startup, "slots_initialized")]
    unified = bool(ctx.facts["kv_unified"])
    sharing = "every slot may use all of it" if unified else "each slot owns its share"
    evidence.append(f"/props per-slot n_ctx={n_ctx_slot} of n_ctx={n_ctx} ({sharing})")
    if setting.value is not None and bool(setting.value) != unified:
        return [setting.verdict(Verdict.INEFFECTIVE, *evidence)]
    return [setting.verdict(Verdict.ACTIVE if unified else Verdict.DISABLED, *evidence)]


def probe_mmproj(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    modalities = ctx.client.props().get("modalities", {})
    evidence = [quote(e) for e in of_kind(ctx.startup, "multimodal_loaded")]
    evidence.append(f"/props modalities={modalities}")
    loaded = ctx.facts["multimodal_loaded"] and any(modalities.values())
    if setting.value is None:
        return [setting.verdict(Verdict.INEFFECTIVE if loaded else Verdict.DISABLED, *evidence)]
    return [setting.verdict(Verdict.ACTIVE if loaded else Verdict.INEFFECTIVE, *evidence)]


def probe_logged_value(ctx: ProbeContext, setting: Setting, *, what: str) -> list[OptionVerdict]:
    """Sizes and counts: the value the server applied, from its start-up log."""
    applied = ctx.applied(what)
    if applied is None:
        return [setting.verdict(Verdict.UNVERIFIED, f"no start-up line states the applied {what}")]
    evidence = f"log: {what} = {applied}"
    if str(applied) != str(setting.value):
        return [setting.verdict(Verdict.INEFFECTIVE, f"{evidence} (the server applied {applied}, not {setting.value})")]
    return [setting.verdict(Verdict.ACTIVE, evidence)]


def probe_metrics(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    before = ctx.client.metrics()
    done = [ctx.complete(ctx.prompt(64))]
    agreement = metrics_agreement(before, ctx.client.metrics(), done)
    return [setting.verdict(Verdict.ACTIVE, "GET /metrics answered", agreement)]


def metrics_agreement(before: dict[str, float], after: dict[str, float], done: Sequence[Completion]) -> str:
    """Do the /metrics counters grow by the prompt_n and cache_n the completions reported?"""
    counted = {name: after.get(f"llamacpp:{name}", 0.0) - before.get(f"llamacpp:{name}", 0.0)
               for name in ("prompt_tokens_total", "prompt_tokens_cached_total")}
    summed = {"prompt_tokens_total": sum(c.prompt_n for c in done),
              "prompt_tokens_cached_total": sum(c.cache_n for c in done)}
    agree = all(counted[name] == summed[name] for name in summed)
    shown = ", ".join(f"{name} +{counted[name]:.0f} (timings: {summed[name]})" for name in summed)
    return f"/metrics {'agrees' if agree else 'DISAGREES'} with the summed timings: {shown}"


# --- probes: LoRA -------------------------------------------------------------------------------------


def _adapter_scales(ctx: ProbeContext, scale: float) -> list[dict[str, float]]:
    return [{"id": index, "scale": scale} for index in range(len(ctx.variant.lora))]


def probe_lora(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    prompt = ctx.prompt(64)
    applied = ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, 1.0))
    zero = ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, 0.0))
    difference = output_difference(applied, zero)
    if difference is None:
        return [setting.verdict(Verdict.INEFFECTIVE, "output at scale 1 equals output at scale 0")]
    return [setting.verdict(Verdict.ACTIVE, f"output at scale 1 differs from scale 0 ({difference})")]


def probe_lora_init_without_apply(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    adapters = ctx.client.lora_adapters()
    scales = f"GET /lora-adapters scales={[adapter['scale'] for adapter in adapters]}"
    if not adapters:
        verdict = Verdict.DISABLED if setting.value is None else Verdict.INEFFECTIVE
        return [setting.verdict(verdict, f"{scales}: no --lora adapters to hold back")]
    prompt = ctx.prompt(64)
    plain = ctx.complete(prompt, cache_prompt=False)  # no lora field: the global scales apply
    as_applied, as_held_back = (
        output_difference(plain, ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, scale)))
        for scale in (1.0, 0.0)
    )
    evidence = (scales,
                f"output with no lora field {'equals' if as_applied is None else 'differs from'} output with scale 1",
                f"output with no lora field {'equals' if as_held_back is None else 'differs from'} output with scale 0")
    if as_held_back is None and as_applied is not None:
        return [setting.verdict(Verdict.DISABLED if setting.value is None else Verdict.ACTIVE, *evidence)]
    if setting.value is None:
        return [setting.verdict(Verdict.DISABLED, *evidence)]
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence, "adapters are applied at scale 1.0 despite the flag "
                            "(upstream issue #28674)")]


# --- probes: reuse --------------------------------------------------------------------------------------


def probe_cache_prompt(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    prompt = ctx.prompt(ctx.doc_tokens)
    before = ctx.client.metrics()
    done = [ctx.complete_with_server_default(prompt)]
    mark = ctx.mark()
    done.append(ctx.complete_with_server_default(prompt, id_slot=done[0].id_slot or 0))
    evidence = (f"resend of a {len(prompt)}-token prompt with no cache_prompt field: {timings(done[1])}",
                *map(quote, of_kind(ctx.events_since(mark), "forced_full_reprocess")),
                metrics_agreement(before, ctx.client.metrics(), done))
    if done[1].cache_n > len(prompt) // 2:
        return [setting.verdict(Verdict.ACTIVE, *evidence)]
    if setting.value is False:
        return [setting.verdict(Verdict.DISABLED, *evidence, "(--no-cache-prompt logs nothing; cache_n shows it)")]
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence)]


def _reask(ctx: ProbeContext) -> tuple[Completion, list[Event]]:
    """Send a document with one question, then with another: what a checkpoint can save."""
    document, (question, other_question) = ctx.prompt(ctx.doc_tokens), ctx.questions()
    slot = ctx.complete(document + question).id_slot
    mark = ctx.mark()
    reask = ctx.complete(document + other_question, id_slot=slot)  # the slot's own checkpoints, not another slot
    return reask, ctx.events_since(mark)


def probe_ctx_checkpoints(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    reask, events = _reask(ctx)
    configured = [quote(e) for e in of_kind(ctx.startup, "checkpoints_enabled", "checkpoints_disabled")]
    measured = [f"re-ask of a {ctx.doc_tokens}-token document: {timings(reask)}"]
    measured += [quote(e) for e in of_kind(events, "checkpoint_restored", "forced_full_reprocess")]
    if not ctx.needs_checkpoints:
        return [setting.verdict(Verdict.INEFFECTIVE, *configured, *measured,
                                "this model's memory can be cut anywhere (no 'does not support partial sequence "
                                "removal' line), so the server never needs a checkpoint")]
    if ctx.facts["checkpoints_max"] == 0:
        return [setting.verdict(Verdict.DISABLED, *configured, *measured)]
    restored = of_kind(events, "checkpoint_restored") and reask.cache_n > 0
    return [setting.verdict(Verdict.ACTIVE if restored else Verdict.INEFFECTIVE, *configured, *measured)]


def probe_checkpoint_min_step(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """User messages just below and just above the minimum spacing: only the second gets a checkpoint.

    A checkpoint goes at a user message's start when it is the first or the last user message, or lies more than
    the minimum spacing past the previous checkpoint; a last message closes the prompt so neither probe is last.
    """
    configured = [quote(e) for e in of_kind(ctx.startup, "checkpoints_enabled", "checkpoints_disabled")]
    min_step = int(ctx.facts["checkpoints_min_spacing"] or ctx.number(setting, "checkpoint-min-step"))
    delimiter = ctx.client.tokenize(CHATML_USER_START)
    near_end = ctx.doc_tokens - PROBE_TAIL_TOKENS + 64  # past the checkpoints near the prompt's end
    needed = len(ctx.bos) + min_step + 2 * MIN_STEP_MARGIN + near_end
    if not ctx.needs_checkpoints or ctx.facts["checkpoints_max"] == 0:
        return [setting.verdict(Verdict.INEFFECTIVE, *configured, "no checkpoints are made on this server "
                                "(see ctx-checkpoints), so their spacing has no effect")]
    if min_step <= MIN_STEP_MARGIN or needed > MAX_PROBE_PROMPT:
        return [setting.verdict(Verdict.UNVERIFIED, *configured, f"showing it needs a {needed}-token prompt; "
                                f"probes stay under {MAX_PROBE_PROMPT} (set a smaller value to probe it)")]
    first = len(ctx.bos)  # the first user message starts right after BOS and always gets a checkpoint
    below, above = first + min_step - MIN_STEP_MARGIN, first + min_step + MIN_STEP_MARGIN
    prompt = ctx.bos + delimiter + ctx.fresh(below - first - len(delimiter))
    prompt += delimiter + ctx.fresh(above - below - len(delimiter))
    prompt += delimiter + ctx.fresh(MIN_STEP_MARGIN - len(delimiter))
    prompt += delimiter + ctx.fresh(near_end)
    mark = ctx.mark()
    ctx.complete(prompt, extra=message_delimiters())
    created = {int(e.fields["n_tokens"]) for e in of_kind(ctx.events_since(mark), "checkpoint_created")}
    evidence = (*configured, f"user messages at tokens {first}, {below}, {above}: checkpoints at "
                f"{sorted(created)} (expected {above}, not {below}, for a spacing of {min_step})")
    shown = above in created and below not in created
    return [setting.verdict(Verdict.ACTIVE if shown else Verdict.INEFFECTIVE, *evidence)]


def probe_slot_prompt_similarity(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """A prompt sharing more than the threshold with a slot should pick it; one sharing less should not."""
    threshold = ctx.number(setting, "slot-prompt-similarity")
    length = ctx.doc_tokens
    sent = ctx.prompt(length)
    ctx.complete(sent)
    selections: list[Event] = []
    for share in ((1 + threshold) / 2, threshold / 2):  # above, then below the threshold
        keep = max(len(ctx.bos) + 1, int(share * length))
        sent = sent[:keep] + ctx.fresh(length - keep)
        mark = ctx.mark()
        ctx.complete(sent)
        selections += of_kind(ctx.events_since(mark), "slot_selected_by_lcp", "slot_selected_by_lru")[:1]
    kinds = [e.kind for e in selections]
    evidence = [f"prompts sharing {(1 + threshold) / 2:.2f}, then {threshold / 2:.2f} of their tokens with a slot:",
                *map(quote, selections)]
    if threshold == 0:
        return [setting.verdict(Verdict.DISABLED if kinds[:1] == ["slot_selected_by_lru"] else Verdict.INEFFECTIVE,
                                *evidence)]
    shown = kinds == ["slot_selected_by_lcp", "slot_selected_by_lru"]
    return [setting.verdict(Verdict.ACTIVE if shown else Verdict.INEFFECTIVE, *evidence)]


def probe_cache_idle_slots(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    warning = ctx.disabled_warning("cache_idle_slots_need_cache_ram")
    if warning is not None:
        return [setting.verdict(Verdict.DISABLED, quote(warning))]
    policy = [quote(e) for e in of_kind(ctx.startup, "idle_slots_policy")]
    if setting.value is False or not policy:
        return [setting.verdict(Verdict.DISABLED, "no 'idle slots will be saved to prompt cache' start-up line")]
    first = ctx.complete(ctx.prompt(ctx.doc_tokens))
    mark = ctx.mark()
    ctx.complete(ctx.prompt(ctx.doc_tokens))
    events = ctx.events_since(mark)
    saved = [e for e in of_kind(events, "idle_slot_saved") if e.slot == first.id_slot]
    cleared = [e for e in of_kind(events, "prompt_cleared") if e.slot == first.id_slot and e.fields["n_tokens"]]
    evidence = [*policy, f"slot {first.id_slot} idle while another prompt ran: "
                f"{len(saved)} 'saving idle slot to prompt cache' line(s)", *map(quote, cleared)]
    if saved:
        return [setting.verdict(Verdict.ACTIVE, *evidence)]
    if ctx.facts["n_slots"] == 1:
        evidence.append("with one slot, the slot a new task takes is never idle, so nothing is saved")
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence)]


def probe_cache_ram(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """A prompt, one short prompt per slot to push it out of every slot, then the first again.

    Slots are chosen by the server (a request pinned with id_slot never goes through the RAM cache).
    """
    configured = [quote(e) for e in of_kind(ctx.startup, "prompt_cache_enabled", "prompt_cache_disabled")]
    first = ctx.prompt(ctx.doc_tokens)
    ctx.complete(first)
    n_slots = int(ctx.facts["n_slots"] or 1)
    for _ in range(n_slots):
        ctx.complete(ctx.prompt(QUESTION_TOKENS))
    mark = ctx.mark()
    back = ctx.complete(first)
    events = ctx.events_since(mark)
    evidence = [*configured, f"back to the first prompt after {n_slots} other prompt(s) took the {n_slots} slot(s): "
                f"{timings(back)}",
                *map(quote, of_kind(events, "ram_prompt_found", "ram_prompt_too_large", "forced_full_reprocess"))]
    if ctx.facts["prompt_cache_enabled"] is False:
        return [setting.verdict(Verdict.DISABLED, *evidence, "RAM prompt cache off")]
    found = of_kind(events, "ram_prompt_found") and back.cache_n > len(first) // 2
    return [setting.verdict(Verdict.ACTIVE if found else Verdict.INEFFECTIVE, *evidence)]


def probe_cache_reuse(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Remove a chunk near the start and compare the shifted reuse with output computed without reuse."""
    warning = ctx.disabled_warning("cache_reuse_unsupported")
    if warning is not None:
        return [setting.verdict(Verdict.DISABLED, quote(warning))]
    min_chunk = int(ctx.number(setting, "cache-reuse"))
    length = max(ctx.doc_tokens, REUSE_CUT_AT + REUSE_REMOVED + min_chunk + PROBE_TAIL_TOKENS)
    if length > MAX_PROBE_PROMPT:
        return [setting.verdict(Verdict.UNVERIFIED, f"showing it needs a {length}-token prompt; "
                                f"probes stay under {MAX_PROBE_PROMPT}")]
    original = ctx.prompt(length)
    slot = ctx.complete(original).id_slot
    cut = len(ctx.bos) + REUSE_CUT_AT
    edited = original[:cut] + original[cut + REUSE_REMOVED:]
    mark = ctx.mark()
    reused = ctx.complete(edited, id_slot=slot)  # shares too little to be given the same slot unasked
    events = ctx.events_since(mark)
    reference = ctx.complete(edited, cache_prompt=False, id_slot=slot)
    evidence = [f"{REUSE_REMOVED} tokens removed at {cut} of {len(original)}, resent: {timings(reused)}",
                *map(quote, of_kind(events, "cache_reuse_chunk", "cache_reuse_ignored", "checkpoint_restored"))]
    if of_kind(events, "cache_reuse_ignored"):
        return [setting.verdict(Verdict.DISABLED, *evidence)]
    if not of_kind(events, "cache_reuse_chunk"):
        off = " (0 turns chunk reuse off)" if min_chunk == 0 else ""
        return [setting.verdict(Verdict.DISABLED if off else Verdict.INEFFECTIVE, *evidence,
                                f"no chunk was shifted{off}")]
    difference = output_difference(reused, reference)
    if difference is not None:
        return [setting.verdict(Verdict.UNSAFE, *evidence,
                                f"reused output differs from the cache_prompt:false reference: {difference}")]
    stale = [e for e in of_kind(events, "checkpoint_restored") if int(e.fields["n_tokens"]) > cut]
    if stale:
        return [setting.verdict(Verdict.UNSAFE, *evidence, "output matched the reference on this probe, but the "
                                f"restored recurrent state (n_tokens={stale[0].fields['n_tokens']}) still holds the "
                                "removed tokens (a recurrent state cannot drop tokens from its middle)")]
    return [setting.verdict(Verdict.ACTIVE, *evidence, "reused output equals the cache_prompt:false reference")]


def probe_slot_save_path(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Save a slot, restart, restore, then resend / re-ask / extend, restoring before each."""
    if setting.value is None:
        try:
            ctx.client.slot_erase(0)
        except ClientError as error:
            return [setting.verdict(Verdict.DISABLED, f"{error} (action=erase)")]
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
        evidence = (f"{seconds:g} never sleeps: /props is_sleeping={_flag(ctx.client.props().get('is_sleeping'))}",
                    f"{len(slept)} 'entering sleeping state' line(s) during the check")
        return [setting.verdict(Verdict.INEFFECTIVE if slept else Verdict.DISABLED, *evidence)]
    prompt = ctx.prompt(ctx.doc_tokens)
    slot = ctx.complete(prompt).id_slot
    before = ctx.complete(prompt, id_slot=slot)
    mark = ctx.mark()
    waited = ctx.handle.wait_until_asleep(seconds)
    if not waited.asleep:
        return [setting.verdict(Verdict.INEFFECTIVE, f"/props is_sleeping=false after {waited.waited_s:.1f} s idle")]
    slept = [quote(e) for e in of_kind(ctx.events_since(mark), "sleep_entering")]
    # In the b11434 source /metrics does not wake a sleeping server, yet build 7e4c0a9 woke on it
    # (docs/llama-server-reuse.md, "Sleep"). Asked last, once the sleep is shown, so the answer is a finding
    # rather than a disturbance.
    ctx.client.metrics()
    woken_by_metrics = not ctx.client.props().get("is_sleeping")
    after = ctx.complete(prompt, id_slot=slot)
    survived = after.cache_n > len(prompt) // 2
    return [setting.verdict(
        Verdict.ACTIVE,
        f"/props is_sleeping=true after {waited.waited_s:.1f} s idle", *slept,
        f"finding: the caches {'survived' if survived else 'did not survive'} sleep: resend before sleep "
        f"{timings(before)}, after waking {timings(after)}",
        f"finding: GET /metrics {'woke' if woken_by_metrics else 'did not wake'} the sleeping server",
    )]


# --- the probe table ----------------------------------------------------------------------------------

SLEEP_OPTION = "sleep-idle-seconds"
# Option -> probe, run in this order. Probes that change what later ones see come last: slot-save-path
# restarts the server, and sleeping empties every cache.
PROBES: dict[str, Probe] = {
    "parallel": probe_parallel,
    "kv-unified": probe_kv_unified,
    "mmproj": probe_mmproj,
    "ctx-size": functools.partial(probe_logged_value, what="n_ctx"),
    "batch-size": functools.partial(probe_logged_value, what="n_batch"),
    "ubatch-size": functools.partial(probe_logged_value, what="n_ubatch"),
    "threads": functools.partial(probe_logged_value, what="n_threads"),
    "metrics": probe_metrics,
    "lora": probe_lora,
    "lora-init-without-apply": probe_lora_init_without_apply,
    "cache-prompt": probe_cache_prompt,
    "ctx-checkpoints": probe_ctx_checkpoints,
    "checkpoint-min-step": probe_checkpoint_min_step,
    "slot-prompt-similarity": probe_slot_prompt_similarity,
    "cache-idle-slots": probe_cache_idle_slots,
    "cache-ram": probe_cache_ram,
    "cache-reuse": probe_cache_reuse,
    "slot-save-path": probe_slot_save_path,
    SLEEP_OPTION: probe_sleep_idle_seconds,
}

