"""One variant's launch, resolved once: ``LaunchSpec``.

A profile's variant says what the user wrote; the harness must still decide how many slots that gives, the context
it launches with (the variant's ``--ctx-size``, else what the driver needs: a session's size plus a margin, a
workload's longest conversations, a probe's context per slot), where slot files go, how long the server idles
before it sleeps, whether outputs are verified and steps may stop early, and the reuse model of that server.
``resolve`` decides each of these once, from the variant, its binary's ``Build`` and the command line; the plan,
the session, a workload's run, ``check`` and ``advise`` take the spec and read none of the options again.
``LaunchSpec.server`` is the one place a variant's server process is made.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from reusebench.capability import Capabilities, state_bytes
from reusebench.capability.build import Build
from reusebench.config.profiles import Variant
from reusebench.llama import facts
from reusebench.llama.memory_log import ModelMemory
from reusebench.llama.server import Server
from reusebench.reuse import expectation, server_inputs
from reusebench.run.settings import DEFAULT, RunSettings

# The harness's --ctx-size for the launch its options make (its slots, and whether they share one KV pool) when the
# variant sets none; None: none is added (a model of the server with its context unknown).
Context = Callable[[server_inputs.Launch], int] | None


def session_context(longest_prompt: int, settings: RunSettings = DEFAULT) -> Callable[[server_inputs.Launch], int]:
    """A session's context: every slot holds prompts up to `longest_prompt` tokens plus the margin. Slots that share
    one KV pool (unified, as `parallel` auto makes them) each may take the whole of it; otherwise each gets its
    share, so the pool is that many times larger."""
    return lambda launch: (longest_prompt + settings.session_ctx_margin) * launch.n_streams


@dataclass(frozen=True)
class LaunchSpec:
    """What one launch of a variant is, decided once (``resolve``)."""

    variant: Variant  # its binary, model, adapters and n_predict; its options are read only by ``resolve``
    build: Build  # its binary: --help, and the rules where builds differ (``capability.build``)
    memory: server_inputs.Memory  # as its binary built it for its model (``Build.memory``), read once
    launch: server_inputs.Launch  # the options that decide reuse, as the server reads them, with the context
    added: tuple[str, ...]  # the llama-server arguments the harness adds to the variant's (--ctx-size, --metrics)
    slot_save_path: Path | None  # the variant's --slot-save-path; None: the session gives a private directory
    sleep_idle_s: float | None  # the variant's --sleep-idle-seconds; None or <= 0: the server never sleeps
    verify: bool  # reused outputs are checked against no-reuse references
    early_stop: bool  # a step the scenario lets stop may end at its count (needs slot erases)

    @property
    def args(self) -> list[str]:
        """Every llama-server argument but host, port, key and log, which the process owns."""
        return [*self.variant.server_args(), *self.added]

    @property
    def capabilities(self) -> Capabilities:
        return self.build.capabilities

    @property
    def n_slots(self) -> int:
        return self.launch.n_slots

    @property
    def ctx_size(self) -> int:
        return self.launch.n_ctx

    @property
    def sleeps(self) -> bool:
        return (self.sleep_idle_s or 0) > 0

    @property
    def slot_actions(self) -> bool:
        """Whether the server takes slot saves, restores and erases (a build may refuse them with an mmproj)."""
        return not self.launch.multimodal or bool(self.capabilities.rules.mmproj_slot_actions)

    def reuse_model(self) -> expectation.ServerModel:
        """A fresh model of this server's reuse (``reuse.expectation``), before its first request."""
        return expectation.ServerModel(self.memory, self.launch, self.capabilities)

    def server(self, *, call_timeout_s: float, extra_args: Sequence[str] = ()) -> Server:
        """The server of this launch, not started; `extra_args` come last (a later option wins). With an mmproj, the
        media marker is pinned (``facts.MEDIA_MARKER``); a speculating launch logs each verified draft
        (``facts.TRACE_ENV``)."""
        pinned = {facts.MEDIA_MARKER_ENV: facts.MEDIA_MARKER} if self.variant.mmproj else {}
        if self.launch.speculative:
            pinned[facts.TRACE_ENV] = "1"
        env = {**os.environ, **pinned} if pinned else None
        return Server.of(self.variant.binary.path, [*self.args, *extra_args], call_timeout_s=call_timeout_s, env=env)


def resolve(variant: Variant, build: Build, *, context: Context, metrics: bool = False,
            verify: bool = True, early_stop: bool = True, memory: ModelMemory | None = None) -> LaunchSpec:
    """The launch of `variant` on its binary's `build` (``capability.build.of``: there is no default, and a build
    of another binary is refused, so no driver predicts with rules not its binary's). `context(n_slots)` is the context the
    harness gives when the variant sets none; `metrics` adds ``--metrics`` unless the variant sets it; `verify` and
    `early_stop` are the command line's, which the variant and the build may still turn off. `memory` is the
    model's as its binary builds it; None: learned now from one start of that binary (kept, so once per binary and
    model file)."""
    if build.path != variant.binary.path:
        raise ValueError(f"{variant.profile} [{variant.name}]: resolved with the build of {build.path}, "
                         f"not its own binary {variant.binary.path}")
    def launch_with(n_ctx: int) -> server_inputs.Launch:
        return server_inputs.launch_of_options(variant.options, multimodal=variant.mmproj is not None,
                                             lora_adapters=len(variant.lora), n_ctx=n_ctx)

    added: list[str] = []
    launch = launch_with(0)
    if variant.option("ctx-size") is None and context is not None:
        launch = launch_with(context(launch))
        added += ["--ctx-size", str(launch.n_ctx)]
    if metrics and variant.option("metrics") is None:
        added.append("--metrics")
    save_path = variant.option("slot-save-path")
    built = memory or build.memory(variant.model)
    # the state's bytes decide what a RAM cache of a size limit keeps (-1 has none; 0 is no cache)
    state = build.state_bytes(variant.model, built, {name: str(variant.option(name)) for name in state_bytes.CACHE_TYPES
                                                     if variant.option(name) is not None}) \
        if launch.cache_ram_mib > 0 else None
    spec = LaunchSpec(variant, build, server_inputs.memory_of(built, state), launch, tuple(added),
                      slot_save_path=None if save_path is None else Path(str(save_path)),
                      sleep_idle_s=variant.number("sleep-idle-seconds"), verify=variant.verify and verify,
                      early_stop=early_stop and not launch.speculative)  # unstreamed calls give no progress to stop at
    # a stopped step's slot is erased at once: a server that refuses slot actions cannot have a step stopped
    return spec if spec.slot_actions else replace(spec, early_stop=False)
