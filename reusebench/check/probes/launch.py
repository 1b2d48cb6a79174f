"""Probes of what the server reports about its configuration: slots, the KV pool, the mmproj, logged values,
/metrics and the LoRA adapters."""

from __future__ import annotations

from collections.abc import Sequence

from reusebench.check.context import ProbeContext, of_kind, quote
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.llama.client import Completion
from reusebench.llama.outputs import difference


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


def _adapter_scales(ctx: ProbeContext, scale: float) -> list[dict[str, float]]:
    return [{"id": index, "scale": scale} for index in range(ctx.spec.launch.lora_adapters)]


def probe_lora(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    prompt = ctx.prompt(64)
    applied = ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, 1.0))
    zero = ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, 0.0))
    found = difference(applied, zero)  # two computations of one shape: identical unless the adapter acts
    if found.identical:
        return [setting.verdict(Verdict.INEFFECTIVE, "output at scale 1 equals output at scale 0")]
    return [setting.verdict(Verdict.ACTIVE, f"output at scale 1 differs from scale 0 ({found.describe()})")]


def probe_lora_init_without_apply(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    adapters = ctx.client.lora_adapters()
    scales = f"GET /lora-adapters scales={[adapter['scale'] for adapter in adapters]}"
    if not adapters:
        verdict = Verdict.DISABLED if setting.value is None else Verdict.INEFFECTIVE
        return [setting.verdict(verdict, f"{scales}: no --lora adapters to hold back")]
    prompt = ctx.prompt(64)
    plain = ctx.complete(prompt, cache_prompt=False)  # no lora field: the global scales apply
    as_applied, as_held_back = (  # whether the output with no lora field equals the one at that scale
        difference(plain, ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, scale))).identical
        for scale in (1.0, 0.0)
    )
    evidence = (scales,
                f"output with no lora field {'equals' if as_applied else 'differs from'} output with scale 1",
                f"output with no lora field {'equals' if as_held_back else 'differs from'} output with scale 0")
    if as_held_back and not as_applied:
        return [setting.verdict(Verdict.DISABLED if setting.value is None else Verdict.ACTIVE, *evidence)]
    if setting.value is None:
        return [setting.verdict(Verdict.DISABLED, *evidence)]
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence, "adapters are applied at scale 1.0 despite the flag "
                            "(upstream issue #28674)")]
