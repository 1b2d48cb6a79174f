"""Every combination predicted over one trace, by the reuse model alone (``trace.predict``): no server.

Each combination is a variant launched the way ``replay`` would launch it (``run.replay.resolve_for_trace``), so a
prediction and its verification run the same server. Combinations run in child processes, one per core, forked
with their prompts and launch as arguments (a forked child inherits them, nothing is pickled on the way in); each
sends back its sums only.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from reusebench.capability.build import Build
from reusebench.run.launch import LaunchSpec
from reusebench.run.replay import resolve_for_trace
from reusebench.trace.mooncake import Trace
from reusebench.trace.predict import Prediction, predict
from reusebench.trace.prompts import BlockIds, TracePrompt
from reusebench.whatif.combinations import Combination


@dataclass(frozen=True)
class Outcome:
    combination: Combination
    spec: LaunchSpec
    prediction: Prediction | None  # None: not predicted (``skipped`` says why)
    skipped: str = ""
    notes: tuple[str, ...] = field(default=())


def _predict_one(prompts: list[TracePrompt], blocks: BlockIds, spec: LaunchSpec) -> Prediction:
    return replace(predict(prompts, spec.reuse_model(), blocks, spec.launch.slot_ctx), expected=[])


def _in_child(send: Connection, prompts: list[TracePrompt], blocks: BlockIds, spec: LaunchSpec) -> None:
    try:
        send.send((True, _predict_one(prompts, blocks, spec)))
    except Exception as error:  # noqa: BLE001  # the parent raises it
        send.send((False, error))
    finally:
        send.close()


def _predict_all(prompts: list[TracePrompt], blocks: BlockIds, specs: Sequence[LaunchSpec],
                 count: int) -> list[Prediction]:
    """Each spec's prediction, `count` forked children at a time (in this process when `count` is 1)."""
    if count <= 1:
        return [_predict_one(prompts, blocks, spec) for spec in specs]
    fork = multiprocessing.get_context("fork")
    found: dict[int, Prediction] = {}
    waiting = list(enumerate(specs))
    running: dict[Connection, tuple[int, BaseProcess]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < count:
                index, spec = waiting.pop(0)
                receive, send = fork.Pipe(duplex=False)
                started: BaseProcess = fork.Process(target=_in_child, args=(send, prompts, blocks, spec), daemon=True)
                started.start()
                send.close()
                running[receive] = (index, started)
            for ready in wait(list(running)):
                assert isinstance(ready, Connection)
                index, child = running.pop(ready)
                try:
                    ok, value = ready.recv()
                except EOFError:
                    child.join()
                    raise RuntimeError(f"the prediction of launch {index + 1} ended without an answer "
                                       f"(exit status {child.exitcode})") from None
                child.join()
                if not ok:
                    raise value
                found[index] = value
    finally:
        for _, left in running.values():
            left.kill()
            left.join()
    return [found[index] for index in range(len(specs))]


def _notes(spec: LaunchSpec) -> tuple[str, ...]:
    if spec.launch.cache_ram_mib > 0 and spec.memory.state is None:
        return (f"--cache-ram {spec.launch.cache_ram_mib}: this model's state was not measured in bytes, so the RAM "
                "cache's size limit is not predicted; a limit that the trace's states fill would evict more",)
    return ()


def predict_combinations(combinations: Sequence[Combination], trace: Trace, prompts: list[TracePrompt],
                         blocks: BlockIds, build: Build, *, workers: int | None = None) -> list[Outcome]:
    """Each combination's prediction over `prompts` on the one `build` they all run on, or why it was left out."""
    memory = build.memory(combinations[0].variant.model)  # every combination loads the same model
    specs = [resolve_for_trace(c.variant, build, trace, memory=memory) for c in combinations]
    not_modelled = specs[0].memory.not_modelled
    if not_modelled:
        raise ValueError(f"the reuse model does not follow this model's memory ({not_modelled}), so it cannot "
                         "predict any launch of it")
    predictions = _predict_all(prompts, blocks, specs, min(len(specs), workers or os.cpu_count() or 1))
    outcomes = []
    for combination, spec, prediction in zip(combinations, specs, predictions, strict=True):
        if prediction.too_long:
            outcomes.append(Outcome(combination, spec, None, skipped=(
                f"a slot of {spec.launch.slot_ctx:,} tokens cannot hold {prediction.too_long} of the requests (the "
                f"longest, with its answer, is {trace.longest:,})")))
        else:
            outcomes.append(Outcome(combination, spec, prediction, notes=_notes(spec)))
    return outcomes
