"""What the suite believes about a model, without a run: ``inspect``.

The model's memory comes from the server that loads it (``capability.learned_memory``: one start, kept), and with
it the window, whether ``--cache-reuse`` can work, what ``--swa-full`` changes, and report A's predicted
re-processed tokens at each size, by the reuse model under the launch options of a profile (report A's own,
``tiny-base``, unless the user names theirs). Nothing is sent to the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from reusebench.capability import build
from reusebench.config import corpus as corpus_mod
from reusebench.config import scenarios
from reusebench.config.profiles import Variant
from reusebench.config.sizes import size_label
from reusebench.llama.memory_log import ModelMemory
from reusebench.records import Role
from reusebench.reuse import server_inputs
from reusebench.run import launch, plan, runner

REPORT_A = ("first_load", "resend", "interleave", "reask", "edit_middle", "restore_disk")


@dataclass(frozen=True)
class StepCost:
    step: str  # "scenario/step"
    prompt_tokens: int
    expected: int | None  # None where the memory is not modelled


@dataclass(frozen=True)
class Inspection:
    model: str
    binary: str
    memory: ModelMemory
    cache_reuse: str  # whether --cache-reuse 256 can work, and if not why
    swa_full: str  # what --swa-full changes
    costs: dict[str, list[StepCost]]  # size label -> report A's steps
    skipped_sizes: dict[str, str]  # size label -> why it is not predicted

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory": {**self.memory.to_dict(), "family": self.memory.family,
                                           "not_modelled": self.memory.not_modelled}}


def _cache_reuse(memory: server_inputs.Memory, spec: launch.LaunchSpec) -> str:
    trial = replace(spec.launch, cache_reuse=256)
    if server_inputs.active_cache_reuse(memory, trial):
        return "can work: the attention cache can shift positions"
    if trial.multimodal:
        return "cannot: llama-server turns it off with an mmproj"
    if not memory.can_shift:
        return "cannot: the model's positions cannot shift (multi-position RoPE); the server turns it off"
    return "cannot: the window's cache is smaller than the context (it can with --swa-full)"


def _swa_full(memory: server_inputs.Memory, spec: launch.LaunchSpec) -> str:
    if not memory.window:
        return "nothing: the model has no window the reuse model follows"
    without = server_inputs.window_cells(memory, spec.launch)
    with_full = server_inputs.window_cells(memory, replace(spec.launch, swa_full=True))
    return (f"the window's cache grows from {without:,} to {with_full:,} cells per stream, so a prefix older "
            f"than the window can be kept without a checkpoint")


def inspect(variant: Variant, sizes: Sequence[int], corpus: str) -> Inspection:
    """`variant`'s model, as its binary builds it, and report A's predicted costs at `sizes` (prompts as long as
    `corpus`'s questions and edit make them). A size the model or a slot cannot hold is refused as `run` refuses it,
    before any server starts."""
    runner.refuse_beyond_context([(variant, size, size) for size in sizes])
    server_build = build.of(variant.binary)  # the build's own rules (probed once, kept)
    built = server_build.memory(variant.model)
    corpus_spec = corpus_mod.load_spec(corpus)
    selected = scenarios.select(REPORT_A)
    costs: dict[str, list[StepCost]] = {}
    skipped: dict[str, str] = {}
    trained = built.n_ctx_train
    spec = None
    for size in sizes:
        if trained and size > trained:
            skipped[size_label(size)] = f"beyond the model's trained context ({trained:,} tokens)"
            continue
        spec = launch.resolve(variant, server_build, context=launch.session_context(size), verify=False, early_stop=False,
                              memory=built)
        planned = plan.plan_session(spec, size, selected, corpus_spec, name=size_label(size))
        costs[size_label(size)] = [
            StepCost(f"{c.scenario}/{c.step}", c.prompt_tokens, None if built.not_modelled else c.prefill)
            for c in planned.calls if c.role == Role.MEASURE]
    spec = spec or launch.resolve(variant, server_build, context=launch.session_context(min(sizes)), verify=False,
                                  early_stop=False, memory=built)
    return Inspection(str(variant.model), str(variant.binary.path), built, _cache_reuse(spec.memory, spec),
                      _swa_full(spec.memory, spec), costs, skipped)


def render(found: Inspection) -> str:
    m = found.memory
    window = (f"{m.window_type} window of {m.window:,} tokens on {m.window_layers} of {m.n_layer} layers"
              if m.window_layers else "none")
    lines = [
        f"model: {found.model}",
        f"architecture: {m.arch} ({m.n_layer} layers, trained context {m.n_ctx_train:,})",
        f"memory, as {found.binary} reports it: {m.family}"
        + (f" (caches: {', '.join(m.caches)})" if m.caches and m.not_modelled else ""),
        f"window: {window}",
        f"--cache-reuse: {found.cache_reuse}",
        f"--swa-full: {found.swa_full}",
        f"reuse model: {'not modelled: ' + m.not_modelled if m.not_modelled else 'predicts every step'}",
    ]
    for size, why in found.skipped_sizes.items():
        lines.append(f"report A at {size}: not predicted, {why}")
    for size, steps in found.costs.items():
        lines.append(f"report A at {size}, re-processed of prompt tokens (predicted):")
        width = max(len(s.step) for s in steps)
        lines += [f"  {s.step:<{width}}  {'not modelled' if s.expected is None else f'{s.expected:,}'}"
                  f" of {s.prompt_tokens:,}" for s in steps]
    return "\n".join(lines)
