"""What the suite believes about a model, without a run: ``inspect``.

The model's memory comes from the server that loads it (``capability.learned_memory``: one start, kept), and with
it the window, whether ``--cache-reuse`` can work, what ``--swa-full`` changes, and the re-processed tokens the
reuse model predicts for each step of a run of a profile's launch (report A's own, ``tiny-base``, unless the user
names theirs): the plan ``run`` makes, so the two agree step by step. Nothing is sent to the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from reusebench.capability import build
from reusebench.config.profiles import Profile
from reusebench.config.sizes import size_label
from reusebench.llama.memory_log import ModelMemory
from reusebench.records import Role
from reusebench.reuse import server_inputs
from reusebench.run import launch, runner
from reusebench.run.selection import Selection


@dataclass(frozen=True)
class StepCost:
    step: str  # "scenario/step"
    prompt_tokens: int
    expected: int | None  # None where the memory is not modelled


@dataclass(frozen=True)
class Inspection:
    model: str
    binary: str
    variant: str  # "profile / variant" whose launch the predictions assume
    launch: str  # its llama-server options, as `run` starts it (the model aside)
    memory: ModelMemory
    cache_reuse: str  # whether --cache-reuse 256 can work, and if not why
    swa_full: str  # what --swa-full changes
    costs: dict[str, list[StepCost]]  # size label -> the steps a run measures

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


def inspect(profile: Profile, sizes: Sequence[int]) -> Inspection:
    """The one variant of `profile`: its model as its binary builds it, and the steps a run of it would measure at
    `sizes`, with what each is predicted to re-process: ``runner.plan_profile``, the plan `run` makes and
    announces, so the two agree step by step. A size the model or a slot cannot hold is refused as `run` refuses
    it, before any server starts."""
    (variant,) = profile.variants
    sessions, planned = runner.planned_sessions(profile, Selection(sizes=tuple(sorted(sizes))))
    built = build.of(variant.binary).memory(variant.model)  # as its binary built it (learned once, kept)
    spec = sessions[0].spec  # the smallest size's launch: what the verdicts below are of
    costs = {size_label(session.size): [
        StepCost(f"{c.scenario}/{c.step}", c.prompt_tokens, None if built.not_modelled else c.expected)
        for c in session.calls if c.role == Role.MEASURE] for session in planned}
    return Inspection(str(variant.model), str(variant.binary.path), f"{profile.name} / {variant.name}",
                      " ".join([*variant.server_args()[2:], *spec.added]), built,
                      _cache_reuse(spec.memory, spec), _swa_full(spec.memory, spec), costs)


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
    lines.append(f"launch ({found.variant}, as `run` starts it): {found.launch}")
    for size, steps in found.costs.items():
        lines.append(f"the run's steps at {size}, re-processed of prompt tokens (predicted):")
        width = max(len(s.step) for s in steps)
        lines += [f"  {s.step:<{width}}  {'not modelled' if s.expected is None else f'{s.expected:,}'}"
                  f" of {s.prompt_tokens:,}" for s in steps]
    lines.append("lengths as the plan counts them, a word a token: a run counts the tokenizer's, and a count moves by "
                 "no more than its prompt's length does")
    return "\n".join(lines)
