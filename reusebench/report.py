"""Tables from records: one per profile variant, scenarios down, sizes across.

Works on records read back from JSONL as well as on a run in progress, so a
report can always be rebuilt from ``results/`` alone.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from tabulate import tabulate

from reusebench.records import Record


def size_label(size: int) -> str:
    return f"{size // 1024}K" if size % 1024 == 0 else str(size)


def _correctness(r: Record) -> str:
    if r.matches_reference is None:
        return "-"
    return "same" if r.matches_reference else f"DIFFERS ({r.mismatch})"


def _cell(r: Record) -> list[Any]:
    if r.error:
        return ["failed", "", "", r.error[:40]]
    return [
        f"{r.prompt_n:,} / {r.ideal:,}",
        f"{(r.prompt_ms or 0) / 1000:.2f}",
        r.verdict or "",
        _correctness(r),
    ]


def variant_tables(records: Iterable[Record]) -> list[tuple[str, str]]:
    """[(title, table text)] for each profile variant, in the order first seen."""
    records = list(records)
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.profile, r.variant)].append(r)
    out = []
    for (profile, variant), rs in groups.items():
        sizes = sorted({r.size for r in rs})
        rows: dict[tuple[str, str], dict[int, Record]] = {}
        for r in rs:
            if r.role == "measure":
                rows.setdefault((r.scenario, r.step), {})[r.size] = r
        header = ["scenario", "step"]
        for size in sizes:
            label = size_label(size)
            header += [f"{label} re-processed / ideal", f"{label} prompt s", f"{label} verdict", f"{label} output"]
        header.append("why (largest size)")
        table = []
        for (scenario, step), by_size in rows.items():
            line: list[Any] = [scenario, step]
            for size in sizes:
                line += _cell(by_size[size]) if size in by_size else ["", "", "", ""]
            largest = by_size[max(by_size)]
            line.append((largest.cause or {}).get("summary", ""))
            table.append(line)
        setup = [r for r in rs if r.role == "setup" and r.endpoint == "/completion"]
        refs = [r for r in rs if r.role == "reference"]
        builds = sorted({r.build for r in rs})
        footer = (
            f"build {', '.join(builds)}; setup prefills: {len(setup)} ({sum(r.prompt_n or 0 for r in setup):,} tokens); "
            f"reference prefills for correctness: {len(refs)} ({sum(r.prompt_n or 0 for r in refs):,} tokens, "
            f"{sum(r.prompt_ms or 0 for r in refs) / 1000:.1f} s)"
        )
        out.append((f"{profile} [{variant}] ({', '.join(r.model for r in rs[:1])})",
                    tabulate(table, header, tablefmt="github", disable_numparse=True) + "\n\n" + footer))
    return out


def render_text(records: Iterable[Record]) -> str:
    return "\n\n".join(f"## {title}\n\n{table}" for title, table in variant_tables(records))


def summary_json(records: Iterable[Record]) -> str:
    """Measured steps as JSON (for machines): counts, times, verdicts and causes, no text."""
    keep = ("session", "profile", "variant", "build", "size", "scenario", "step", "prompt_tokens", "prompt_n",
            "cache_n", "ideal", "excess", "prompt_ms", "ttft_ms", "wall_ms", "verdict", "matches_reference",
            "mismatch", "error")
    rows = [{k: getattr(r, k) for k in keep} | {"cause": (r.cause or {}).get("summary")}
            for r in records if r.role == "measure"]
    return json.dumps(rows, indent=2)
