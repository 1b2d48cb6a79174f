"""A service under load: one workload (``workloads/``) per commit, its users at once on one server.

Tracks the turns that should have hit and did not, by class (slot-kept, RAM-restored, not held; with and
without LoRA) and by the log's cause, so a llama.cpp commit that fixes the LoRA clear after a RAM restore
shows as a drop of ``cause: LoRA-change clear after restore``; and the other users' decode ms per token and
TTFT while a long prefill runs against while none does (p50, p90). Counts and milliseconds only: asv takes
lower as better. The workload is ``$REUSEBENCH_ASV_WORKLOAD`` (default: report-b-service; empty: none runs and
these figures are n/a); its server profile takes the llama-server asv built, as the other modules do (``common``).
On a build too old for the workload (an option its variant sets, the model's architecture) the figures are n/a
and say why, as a variant that does not apply is in the other modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from asv_runner.benchmarks.mark import SkipNotImplemented

from reusebench.config import profiles, workload
from reusebench import records
from reusebench.report import service_report
from reusebench.run.driver import ServiceDriver
from reusebench.run.recording import RunDir

from . import common

WORKLOAD = os.environ.get("REUSEBENCH_ASV_WORKLOAD", "report-b-service")


NOT_APPLICABLE = "not applicable"  # the figures' key when the workload cannot run on this build


def _run_workload() -> dict[str, Any]:
    """The workload's figures, or why it does not apply to this build (an older llama.cpp: n/a, not failed)."""
    load = workload.load_workload(WORKLOAD)
    built = common.installed_binary()
    if built is not None:
        os.environ[common.BINARY_ENV] = str(built)
    profile = profiles.load_profile(load.profile, check_binary=False)
    variant = profile.variant(load.variant) if load.variant else profile.variants[0]
    missing = common.not_applicable(profile, [variant.name])
    if missing:
        why = f"workload {WORKLOAD} does not apply to this build: {missing[variant.name]}"
        print(f"benchmarks: {why}", file=sys.stderr)
        return {NOT_APPLICABLE: why}
    profiles.load_profile(load.profile)  # now checked against the binary's --help
    run = RunDir.create(Path(os.environ.get("REUSEBENCH_RESULTS", common.REPO / "results")))
    with records.RecordWriter(run.records_path) as writer:
        result = ServiceDriver(load, variant, writer, run_id=run.run_id, log_dir=run.log_dir).run()
    failed = [r.error for r in result.records if r.error]
    if failed:
        raise RuntimeError(f"workload {WORKLOAD}: {len(failed)} call(s) failed, the first: {failed[0]}")
    print(service_report.render(result.records), file=sys.stderr)
    return service_report.figures(records.read_records(run.records_path))


class _WorkloadFigures:
    timeout = 1800  # a few minutes of workload on 2 cores

    def setup_cache(self) -> dict[str, Any]:
        return _run_workload() if WORKLOAD else {}


def _figure(self: _WorkloadFigures, figures: dict[str, Any], name: str) -> float:
    if not figures:
        raise SkipNotImplemented("REUSEBENCH_ASV_WORKLOAD is empty: no workload ran")
    if NOT_APPLICABLE in figures:
        raise SkipNotImplemented(figures[NOT_APPLICABLE])
    return figures[name]


class WorkloadMisses(_WorkloadFigures):
    """Turns that should have hit (a conversation continuing, a regeneration) and re-processed more."""

    params = (list(service_report.MISS_FIGURES),)
    param_names = ["class"]
    unit = "turns"
    version = "1"
    track_missed_turns = _figure


class WorkloadInterference(_WorkloadFigures):
    """Other users' decode ms per token and TTFT ms, during a long prefill and with none running."""

    params = (list(service_report.INTERFERENCE_FIGURES),)
    param_names = ["figure"]
    unit = "ms"
    version = "1"
    track_other_users_ms = _figure
