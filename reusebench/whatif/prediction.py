"""Every combination predicted over one trace, by the reuse model alone (``trace.predict``): no server.

Each combination is a variant launched the way ``replay`` would launch it (``run.replay.resolve_for_trace``), so a
prediction and its verification run the same server. Combinations run in worker processes, one per core, which
inherit the trace's prompts (fork); each sends back its sums only.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

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


_WORK: tuple[list[TracePrompt], BlockIds, list[LaunchSpec]] | None = None  # what forked workers inherit


def _predict_one(index: int) -> Prediction:
    assert _WORK is not None
    prompts, blocks, specs = _WORK
    spec = specs[index]
    return replace(predict(prompts, spec.reuse_model(), blocks, spec.launch.slot_ctx), expected=[])


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
    global _WORK
    _WORK = (prompts, blocks, specs)
    try:
        count = min(len(specs), workers or os.cpu_count() or 1)
        if count > 1:
            with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork")) as pool:
                predictions = list(pool.map(_predict_one, range(len(specs))))
        else:
            predictions = [_predict_one(i) for i in range(len(specs))]
    finally:
        _WORK = None
    outcomes = []
    for combination, spec, prediction in zip(combinations, specs, predictions, strict=True):
        if prediction.too_long:
            outcomes.append(Outcome(combination, spec, None, skipped=(
                f"a slot of {spec.launch.slot_ctx:,} tokens cannot hold {prediction.too_long} of the requests (the "
                f"longest, with its answer, is {trace.longest:,})")))
        else:
            outcomes.append(Outcome(combination, spec, prediction, notes=_notes(spec)))
    return outcomes
