"""Probes of prompt reuse: cache-prompt, checkpoints, slot selection by similarity, idle slots, the RAM cache and
chunk reuse. Each compares what was reused with what the server logged and, where output can differ, with a
``cache_prompt: false`` reference."""

from __future__ import annotations

import dataclasses

from reusebench.check.context import PROBE_TAIL_TOKENS, QUESTION_TOKENS, ProbeContext, of_kind, quote, timings
from reusebench.check.probes.launch import metrics_agreement
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.llama import startup
from reusebench.llama.client import Completion
from reusebench.llama.facts import CHATML_USER_START, message_delimiters
from reusebench.llama.logs import Event
from reusebench.reuse import server_inputs
from reusebench.reuse.verification import WRONG

MAX_PROBE_PROMPT = 3072  # a probe that would need a longer prompt reports UNVERIFIED instead
# The --cache-reuse probe removes a chunk this far into the document, of this many tokens: chunk reuse then
# shifts what follows, which a recurrent state cannot follow (docs/llama-server-reuse.md, "--cache-reuse").
REUSE_CUT_AT = 64
REUSE_REMOVED = 32
MIN_STEP_MARGIN = 16  # user messages this far below and above --checkpoint-min-step


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


def _reask_from_ram(ctx: ProbeContext) -> tuple[Completion, list[Event]]:
    """A document with one question, one short prompt per slot (the document goes to the RAM cache), then the
    document with another question. A sliding window's cache keeps a re-ask's state as it is when the answer and
    the question fit in it; a state that comes back from RAM holds only the window, and needs a checkpoint."""
    document, (question, other_question) = ctx.prompt(ctx.doc_tokens), ctx.questions()
    ctx.complete(document + question)
    for _ in range(int(ctx.facts["n_slots"] or 1)):
        ctx.complete(ctx.prompt(QUESTION_TOKENS))
    mark = ctx.mark()
    reask = ctx.complete(document + other_question)  # no id_slot: a request for a slot skips the RAM cache
    return reask, ctx.events_since(mark)


def probe_ctx_checkpoints(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    configured = [quote(e) for e in of_kind(ctx.startup, "checkpoints_enabled", "checkpoints_disabled")]
    window = ctx.memory.kind == "swa"
    if window and ctx.spec.launch.swa_full:
        return [setting.verdict(Verdict.INEFFECTIVE, *configured, "--swa-full keeps every position in the window "
                                "layers' cache, so the server makes no checkpoint and needs none")]
    if window and ctx.facts["prompt_cache_enabled"] is False:
        return [setting.verdict(Verdict.INEFFECTIVE, *configured, "a sliding window's own cache keeps a re-ask as it "
                                "is; only a state from the RAM cache needs a checkpoint, and the RAM cache is off")]
    reask, events = _reask_from_ram(ctx) if window else _reask(ctx)
    through = " after the RAM cache held it" if window else ""
    measured = [f"re-ask of a {ctx.doc_tokens}-token document{through}: {timings(reask)}"]
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
    if not ctx.capabilities.rules.completion_message_delimiters:
        return [setting.verdict(Verdict.UNVERIFIED, *configured, "the probe marks its user messages with "
                                "/completion's message_delimiters, which this build ignores (reusebench probe: "
                                f"{ctx.capabilities.evidence.get('completion_message_delimiters', 'not shown')})")]
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
    outcome, said = ctx.output_check(reused, reference, edited, id_slot=slot)
    if outcome == WRONG:
        return [setting.verdict(Verdict.UNSAFE, *evidence, f"reused output {said}")]
    stale = [e for e in of_kind(events, "checkpoint_restored") if int(e.fields["n_tokens"]) > cut]
    if stale:
        return [setting.verdict(Verdict.UNSAFE, *evidence, "output matched the reference on this probe, but the "
                                f"restored recurrent state (n_tokens={stale[0].fields['n_tokens']}) still holds the "
                                "removed tokens (a recurrent state cannot drop tokens from its middle)")]
    return [setting.verdict(Verdict.ACTIVE, *evidence, f"reused output {said}")]


def probe_swa_full(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """A document twice as long as the window's cache would be without --swa-full, then the same with one token
    changed at its middle: a full-size cache keeps the half before the change, one that held only the last cells
    has nothing before it to keep (its checkpoints sit at the end). The price, from the start-up lines: the window
    layers' cache at its full size against the size it would have."""
    warning = ctx.disabled_warning("swa_full_unsupported")
    if warning is not None:
        return [setting.verdict(Verdict.DISABLED, quote(warning))]
    if not ctx.memory.window:
        return [setting.verdict(Verdict.INEFFECTIVE, f"the model's memory is {ctx.memory.kind}, without a window")]
    if ctx.memory.kind != "swa":  # the recurrent state decides what is kept; the window only moves the threshold
        return [setting.verdict(Verdict.UNVERIFIED, "no probe yet for a window beside recurrent layers; "
                                "`reusebench inspect` predicts what --swa-full changes on this model")]
    launch = dataclasses.replace(ctx.spec.launch, swa_full=False, n_ctx=ctx.applied("n_ctx") or 0)
    without = server_inputs.window_cells(ctx.memory, launch)
    length = 2 * without
    if length > MAX_PROBE_PROMPT:
        return [setting.verdict(Verdict.UNVERIFIED, f"showing it needs a {length}-token prompt; probes stay under "
                                f"{MAX_PROBE_PROMPT}")]
    prompt = ctx.prompt(length)
    slot = ctx.complete(prompt).id_slot
    middle = len(prompt) // 2
    edited = [*prompt[:middle], *ctx.fresh(1), *prompt[middle + 1:]]
    changed = ctx.complete(edited, id_slot=slot)
    caches = [cache for cache in startup.kv_caches(ctx.startup_lines) if cache.window]
    evidence = [f"one token of a {len(prompt)}-token document changed at {middle}: {timings(changed)}"]
    if caches:
        full = caches[0]
        evidence.append(f"the window layers' cache holds {full.cells:,} cells ({full.mib:.2f} MiB) where it would "
                        f"hold {without:,} without --swa-full ({full.mib * without / full.cells:.2f} MiB): "
                        f"{full.mib * (full.cells - without) / full.cells:.2f} MiB more for {full.layers} layers")
    kept = changed.cache_n >= middle - 1
    return [setting.verdict(Verdict.ACTIVE if kept else Verdict.INEFFECTIVE, *evidence)]
