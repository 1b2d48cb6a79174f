"""A workload run more than once (``reusebench workload --repeat``, the asv timings): each run's records, every
figure's median, min and max over the runs, and whether every run gave the same."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from reusebench.records import Record
from reusebench.report.service_report import figures, render


def runs(records: Sequence[Record]) -> list[list[Record]]:
    """The records of each run of a workload, in order: ``reusebench workload --repeat`` keeps them in one file,
    told apart by their ``repeat``."""
    by_repeat: dict[Any, list[Record]] = {}
    for r in records:
        by_repeat.setdefault(r.extra.get("repeat"), []).append(r)
    return list(by_repeat.values())


def _known(per_run: Sequence[dict[str, float]], name: str) -> list[float]:
    return [f[name] for f in per_run if f[name] == f[name]]  # NaN: the figure did not occur in that run


def spread_table(per_run: Sequence[dict[str, float]]) -> str:
    """Each figure over the runs: median, min and max, and whether every run gave the same."""
    rows = []
    for name in per_run[0]:
        values = _known(per_run, name)
        if not values:
            rows.append([name, "-", "-", "-", "no run had it"])
            continue
        low, mid, high = min(values), statistics.median(values), max(values)
        if len(values) < len(per_run):
            same = f"{len(values)} of {len(per_run)} runs had it"
        else:
            same = "yes" if low == high else f"no: {high - low:.4g} apart"
        rows.append([name, f"{mid:.4g}", f"{low:.4g}", f"{high:.4g}", same])
    return tabulate(rows, ["figure", "median", "min", "max", "the same in every run"], tablefmt="github",
                    disable_numparse=True)


def median_figures(per_run: Sequence[dict[str, float]]) -> dict[str, float]:
    """asv's figure for repeated runs: each one's median over the runs that had it."""
    return {name: statistics.median(values) if (values := _known(per_run, name)) else float("nan")
            for name in per_run[0]}


def _with_ratios(found: dict[str, float]) -> dict[str, float]:
    """The figures and, for reading, what a long prefill multiplies: during over alone, at the median."""
    out = dict(found)
    for what in ("decode ms per token", "ttft ms"):
        during, alone = found[f"{what} during p50"], found[f"{what} alone p50"]
        out[f"{what} p50 ratio (during / alone)"] = during / alone if alone else float("nan")
    return out


def render_runs(records: Sequence[Record]) -> str:
    """One run's report, or each run's and then every figure's spread over them."""
    found = runs(records)
    if len(found) <= 1:
        return render(found[0] if found else [])
    parts = [f"## Run {number} of {len(found)}\n\n{render(run)}" for number, run in enumerate(found, start=1)]
    parts.append(f"## Over the {len(found)} runs\n\n" + spread_table([_with_ratios(figures(run)) for run in found]))
    return "\n\n".join(parts)


def figures_json(records: Sequence[Record]) -> str:
    """Each run's figures as JSON (``--json``): name -> number, null where the run did not have it."""
    return json.dumps([{name: None if value != value else value for name, value in figures(run).items()}
                       for run in runs(records)], indent=2)
