"""A service under load, per commit: one workload's counts on the serial schedule, and the interference timings.

``WorkloadMisses`` tracks the turns that should have hit and did not, by class (slot-kept, RAM-restored, not
held; with and without LoRA) and by the log's cause, so a llama.cpp commit that fixes the LoRA clear after a RAM
restore shows as a drop of ``cause: LoRA-change clear after restore``. The workload runs on the serial schedule
(``reusebench.run.service``): one request at a time in an order fixed by the file, so one build gives the same
counts on every run and a change on the graph is a change in llama.cpp.

``WorkloadInterference`` tracks the other users' decode ms per token and TTFT while a long prefill runs against
while none does (p50, p90), from the arranged ``interference`` workload, which overlaps requests by design.
Those are timings: it runs ``REPEAT`` times and asv tracks each figure's median.

Counts and milliseconds only: asv takes lower as better. Environment:

- ``REUSEBENCH_ASV_WORKLOAD``: the counts' workload (default: report-b-service; empty: none runs, n/a);
- ``REUSEBENCH_ASV_INTERFERENCE``: the timings' workload (default: interference; empty: none runs, n/a);
- ``REUSEBENCH_ASV_INTERFERENCE_REPEAT``: its runs per commit (default 3).

Their server profile takes the llama-server asv built, as the other modules do (``common``). On a build too old
for a workload (an option its variant sets, the model's architecture) its figures are n/a and say why, as a
variant that does not apply is in the other modules.
"""

from __future__ import annotations

import sys
from typing import Any

from asv_runner.benchmarks.mark import SkipNotImplemented

from reusebench import records
from reusebench.capability import build
from reusebench.config import asv_selection, profiles, workload
from reusebench.records import RunKind
from reusebench.report import service_report, service_runs
from reusebench.run import provenance
from reusebench.run.opening import open_run
from reusebench.run.service import resolve_for_workload, service_run

from . import common

SERVICES = asv_selection.services_from_env()
WORKLOAD, INTERFERENCE, REPEAT = SERVICES.workload, SERVICES.interference, SERVICES.interference_repeat

NOT_APPLICABLE = "not applicable"  # the figures' key when the workload cannot run on this build


def _run_workload(name: str, repeat: int = 1) -> dict[str, Any]:
    """The workload's figures (each one's median over `repeat` runs), or why it does not apply to this build (an
    older llama.cpp: n/a, not failed)."""
    load = workload.load_workload(name)
    # every variant on the llama-server asv built for this commit, where it built one
    chosen = load.variant or profiles.outline(load.profile).variants[0]
    loaded = profiles.load_for_build(load.profile, [chosen], binary=common.installed_binary())
    if loaded.skipped:
        why = f"workload {name} does not apply to this build: {next(iter(loaded.skipped.values()))}"
        print(f"benchmarks: {why}", file=sys.stderr)
        return {NOT_APPLICABLE: why}
    profile = loaded.profile
    variant = profile.variant(loaded.runnable[0])
    spec = resolve_for_workload(variant, build.of(variant.binary), load)
    stamp = provenance.of_launches(profile, [spec], RunKind.WORKLOAD, {"workload": name, "repeat": repeat})
    with open_run(common.results_dir(), stamp) as (run, writer):
        for number in range(1, repeat + 1):
            result = service_run(load, spec, writer, run=run, repeat=number if repeat > 1 else None).run()
            failed = [r.error for r in result.records if r.error]
            if failed:
                raise RuntimeError(f"workload {name}: {len(failed)} call(s) failed, the first: {failed[0]}")
    kept = records.read_records(run.records_path)
    print(service_runs.render_runs(kept), file=sys.stderr)
    return service_runs.median_figures([service_report.figures(one) for one in service_runs.runs(kept)])


def _figure(self: object, figures: dict[str, Any], name: str) -> float:
    if not figures:
        raise SkipNotImplemented("no workload ran: its REUSEBENCH_ASV_* variable is empty")
    if NOT_APPLICABLE in figures:
        raise SkipNotImplemented(figures[NOT_APPLICABLE])
    return figures[name]


class WorkloadMisses:
    """Turns that should have hit (a conversation continuing, a regeneration) and re-processed more."""

    params = (list(service_report.MISS_FIGURES),)
    param_names = ["class"]
    unit = "turns"
    version = "2"  # 2: the serial schedule (version 1 counted free-running threads, which vary run to run)
    timeout = 1800  # a minute of workload on 2 cores
    track_missed_turns = _figure

    def setup_cache(self) -> dict[str, Any]:
        return _run_workload(WORKLOAD) if WORKLOAD else {}


class WorkloadInterference:
    """Other users' decode ms per token and TTFT ms, during a long prefill and with none running: medians."""

    params = (list(service_report.INTERFERENCE_FIGURES),)
    param_names = ["figure"]
    unit = "ms"
    version = "2"  # 2: the arranged interference workload, median of REPEAT runs (1: the service workload, once)
    timeout = 1800
    track_other_users_ms = _figure

    def setup_cache(self) -> dict[str, Any]:
        return _run_workload(INTERFERENCE, REPEAT) if INTERFERENCE else {}
