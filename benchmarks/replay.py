"""A production trace's shape, per commit: the first requests of the shipped Mooncake conversation trace, scaled to a
CPU, replayed serially (``reusebench replay``), so the nightly shows llama.cpp commits on real traffic shapes too.

``TraceReplay`` tracks the tokens re-processed over the whole replay: what the server measured, what the reuse
model expected of this build, and the trace's own ideal (an unbounded prefix cache), and the measured tokens over
the ideal. ``TraceReplaySeconds`` tracks the prefill seconds, all of them and those spent over the ideal. Serially,
one build gives the same counts on every run. Counts and seconds only: asv takes lower as better.

Environment (docs/environment.md):

- ``REUSEBENCH_ASV_TRACE``: the trace, a shipped name or a path (default: mooncake-conversation; empty: none runs);
- ``REUSEBENCH_ASV_TRACE_PROFILE``: the server profile (default: tiny-qwen35, its first variant);
- ``REUSEBENCH_ASV_TRACE_REQUESTS``: the first N requests (default 300), at 1/16 of the trace's lengths.
"""

from __future__ import annotations

import io
import sys
from typing import Any

from asv_runner.benchmarks.mark import SkipNotImplemented

from reusebench import records
from reusebench.capability import build
from reusebench.config import asv_selection, profiles
from reusebench.machine import host
from reusebench.records import RunKind
from reusebench.report import replay_report
from reusebench.run import provenance
from reusebench.run.opening import open_run
from reusebench.run.replay import Replay, ReplayMode, resolve_for_trace
from reusebench.trace.mooncake import TraceSelection
from reusebench.trace.prompts import BlockIds, trace_prompts, vocabulary

from . import common

SERVICES = asv_selection.services_from_env()
TRACE, PROFILE, REQUESTS = SERVICES.trace, SERVICES.trace_profile, SERVICES.trace_requests
SCALE = 16  # 32-token blocks: about 750 tokens a request, a few hundred requests in well under a minute on 2 cores
NOT_APPLICABLE = "not applicable"



def _replay() -> dict[str, Any]:
    # its first variant on the llama-server asv built for this commit, where it built one
    loaded = profiles.load_for_build(PROFILE, profiles.outline(PROFILE).variants[:1], binary=common.installed_binary())
    if loaded.skipped:
        why = f"profile {PROFILE} does not apply to this build: {next(iter(loaded.skipped.values()))}"
        print(f"benchmarks: {why}", file=sys.stderr)
        return {NOT_APPLICABLE: why}
    profile = loaded.profile
    variant = profile.variant(loaded.runnable[0])
    whole, trace = TraceSelection(TRACE, SCALE, limit=REQUESTS).load()
    blocks = BlockIds(vocabulary(variant.model), trace.block_tokens)
    spec = resolve_for_trace(variant, build.of(variant.binary), trace)
    stamp = provenance.of_launches(profile, [spec], RunKind.REPLAY, {"trace": whole.name, "requests": len(trace.requests),
                                                                     "scale": trace.scale, "mode": ReplayMode().name})
    with open_run(common.results_dir(), stamp) as (run, writer):
        Replay(trace_prompts(trace, blocks), blocks, spec, writer, run=run, trace_name=whole.name, mode=ReplayMode(),
               out=io.StringIO()).run()
    # the last minute's load, as the replay ends: other work beside it makes its seconds noise
    busy = host.under_load(host.capture().to_dict()) is not None
    kept = records.read_records(run.records_path)
    print(replay_report.render(kept), file=sys.stderr)
    (found,) = replay_report.figures(kept)
    if found.failed:
        raise RuntimeError(f"replay of {TRACE}: {found.failed} request(s) failed")
    return {"measured": found.measured, "expected": found.expected, "ideal": found.ideal,
            "over ideal": found.measured - found.ideal, "prefill": found.prefill_s, "prefill over ideal": found.excess_s,
            "busy": int(busy)}


def _setup_cache(self: object) -> dict[str, Any]:
    """One replay per commit for both classes: asv keys a cache by its function, and they share this one."""
    return _replay() if TRACE else {}


def _figure(figures: dict[str, Any], name: str) -> float:
    if not figures:
        raise SkipNotImplemented("no trace replayed: REUSEBENCH_ASV_TRACE is empty")
    if NOT_APPLICABLE in figures:
        raise SkipNotImplemented(figures[NOT_APPLICABLE])
    return figures[name]


class TraceReplay:
    """Tokens re-processed over the replayed requests: measured, expected, the trace's ideal, measured over ideal."""

    params = (["measured", "expected", "ideal", "over ideal"],)
    param_names = ["tokens"]
    unit = "tokens"
    version = "1"
    timeout = 1800
    setup_cache = _setup_cache

    def track_reprocessed_tokens(self, figures: dict[str, Any], name: str) -> float:
        return _figure(figures, name)


class TraceReplayBusy:
    """1 where other work loaded the machine as the replay ended (a 1-minute load average above one task per core
    plus 0.5), else 0: the replay's seconds are noise then, and `reusebench compare` does not judge them. Context."""

    unit = "flag"
    version = "1"
    timeout = 1800
    setup_cache = _setup_cache

    def track_busy(self, figures: dict[str, Any]) -> float:
        return _figure(figures, "busy")


class TraceReplaySeconds:
    """Prefill seconds over the replayed requests: all of them, and those spent over the trace's ideal."""

    params = (["prefill", "prefill over ideal"],)
    param_names = ["seconds"]
    unit = "seconds"
    version = "1"
    timeout = 1800
    setup_cache = _setup_cache

    def track_prefill_seconds(self, figures: dict[str, Any], name: str) -> float:
        return _figure(figures, name)
