"""One self-contained HTML page per scenario run, and the list of every run's page.

``reusebench view RUN`` (and ``reusebench run`` at its end) writes ``results/runs/RUN_ID/index.html`` from the
run's records, and ``results/index.html``, the list of all runs with a page. Per session (profile, variant,
size), one row per measured step: the tokens it re-processed beside a perfect cache's ideal and the reuse
model's expected, as bars on a log axis (so that 4 and 131,111 tokens both read), the verdict, the output
check, the cause in the server's words and the model's, and the prefill seconds (n/a for a step stopped
once its count was known), flagged when the machine was loaded before the step.

The bars are inline SVG written here: a few rectangles per row need no chart library, and the page then
opens from ``file://`` with no request outside it. Records hold no prompt text, so neither can the page:
lengths, counts, hashes and the server's numbers only.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from reusebench import records
from reusebench.config.sizes import size_label
from reusebench.machine.host import under_load
from reusebench.records import Record, Role
from reusebench.report import run_report

PAGE = "index.html"
BAR_WIDTH, BAR_HEIGHT, BAR_GAP = 360, 9, 3
BARS = (("re-processed", "prompt_n", "#c0392b"), ("ideal", "ideal", "#27ae60"), ("expected", "expected", "#2c3e50"))
STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: middle; }
th { background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.verdict-hit { color: #1e8449; } .verdict-miss, .verdict-UNEXPECTED, .verdict-WRONG { color: #b03a2e; font-weight: 600; }
.verdict-partial { color: #b9770e; }
.loaded { background: #fdebd0; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
.muted { color: #777; }
"""


def write_run_page(run_dir: Path) -> Path:
    """The run's page, from its records.jsonl; returns its path."""
    run_records = records.read_records(run_dir / "records.jsonl")
    page = run_dir / PAGE
    page.write_text(render_run(run_dir.name, run_records))
    return page


def write_index(results_dir: Path) -> Path:
    """``results/index.html``: every run under ``results/runs`` that has a page, newest first."""
    rows = []
    for run_dir in sorted((results_dir / "runs").glob("*/"), reverse=True):
        if not (run_dir / PAGE).is_file():
            continue
        rs = records.read_records(run_dir / "records.jsonl")
        profiles = ", ".join(dict.fromkeys(r.profile for r in rs))
        sessions = len({r.session for r in rs})
        rows.append(f'<tr><td><a href="runs/{_e(run_dir.name)}/{PAGE}">{_e(run_dir.name)}</a></td>'
                    f"<td>{_e(profiles)}</td><td class=n>{sessions}</td><td class=n>{len(rs)}</td></tr>")
    body = ("<h1>reusebench runs</h1><table><tr><th>run</th><th>profiles</th><th>sessions</th><th>records</th></tr>"
            + "".join(rows) + "</table>")
    index = results_dir / PAGE
    index.write_text(_page("reusebench runs", body))
    return index


def render_run(run_id: str, run_records: Sequence[Record]) -> str:
    sessions: dict[str, list[Record]] = defaultdict(list)
    for r in run_records:
        sessions[r.session].append(r)
    parts = [f"<h1>reusebench run {_e(run_id)}</h1>", _legend()]
    for name, rs in sessions.items():
        parts.append(_session(name, rs))
    return _page(f"reusebench run {run_id}", "\n".join(parts))


def _session(name: str, rs: list[Record]) -> str:
    measured = [r for r in rs if r.role == Role.MEASURE]
    first = rs[0]
    budget = next(iter(records.prefill_budgets(rs)), None)
    head = (f"<h2>{_e(first.profile)} [{_e(first.variant)}] at {size_label(first.size)}</h2>"
            f"<p class=muted>{_e(name)}; build {_e(first.build)}; model {_e(first.model)}"
            + (f"; {_e(budget.line().split(': ', 1)[1])}" if budget else "") + "</p>")
    if not measured:
        return head + "<p>no measured step</p>"
    scale = max(r.prompt_tokens or 1 for r in measured)
    rows = "".join(_row(r, scale) for r in measured)
    return (head + "<table class=steps><tr><th>step</th><th>tokens (log axis)</th><th>re-processed / ideal / "
            "expected</th><th>verdict</th><th>output</th><th>why</th><th>model's why</th><th>prefill s</th></tr>"
            + rows + "</table>")


def _row(r: Record, scale: int) -> str:
    if r.error:
        return (f"<tr data-step='{_e(r.scenario)}/{_e(r.step)}'><td>{_e(r.scenario)}/{_e(r.step)}</td>"
                f"<td colspan=7>failed: {_e(r.error)}</td></tr>")
    load = under_load(r.host)
    seconds = "n/a (stopped at its count)" if r.prompt_ms is None else f"{r.prompt_ms / 1000:.2f}"
    numbers = " / ".join("-" if getattr(r, field) is None else f"{getattr(r, field):,}" for _, field, _ in BARS)
    verdict = r.verdict or ""
    return (f"<tr data-step='{_e(r.scenario)}/{_e(r.step)}'><td>{_e(r.scenario)}/{_e(run_report.step_label(r))}</td>"
            f"<td>{_bars(r, scale)}</td><td class=n>{numbers}</td>"
            f"<td class='verdict-{_e(verdict.split()[0] if verdict else '')}'>{_e(verdict)}</td>"
            f"<td>{_e(run_report.correctness(r))}</td><td>{_e((r.cause or {}).get('summary', ''))}</td>"
            f"<td>{_e(r.cause_expected or '')}</td>"
            f"<td class='n{' loaded' if load else ''}' title='{_e(load or '')}'>{seconds}"
            f"{' (under load)' if load else ''}</td></tr>")


def _bars(r: Record, scale: int) -> str:
    """Re-processed, ideal and expected on one log axis from 1 token to the longest prompt of the session."""
    top = math.log10(max(scale, 10))
    rects = []
    for i, (label, field, colour) in enumerate(BARS):
        value = getattr(r, field)
        if value is None:
            continue
        width = max(1.0, BAR_WIDTH * math.log10(max(value, 1) * 10) / (top + 1))  # 1 token still shows
        y = i * (BAR_HEIGHT + BAR_GAP)
        rects.append(f"<rect class='bar' data-kind='{label}' data-tokens='{value}' x='0' y='{y}' width='{width:.1f}' "
                     f"height='{BAR_HEIGHT}' fill='{colour}'><title>{label}: {value:,} tokens</title></rect>")
    height = len(BARS) * (BAR_HEIGHT + BAR_GAP)
    return f"<svg width='{BAR_WIDTH}' height='{height}' role='img'>{''.join(rects)}</svg>"


def _legend() -> str:
    keys = "".join(f"<span style='background:{colour}'></span>{label}" for label, _, colour in BARS)
    return (f"<p class=legend>{keys} &nbsp; bars on a log axis: each tenfold more tokens adds the same length; a "
            "shaded prefill time means the machine was loaded before the step</p>")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)

