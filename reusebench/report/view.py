"""One self-contained HTML page per run (scenarios, a workload, an option check), and the list of every page.

``reusebench view RUN`` (and ``reusebench run`` at its end) writes ``results/runs/RUN_ID/index.html`` from the
run's records, and ``results/index.html``, the list of all runs with a page. Per session (profile, variant,
size), one row per measured step: the tokens it re-processed beside a perfect cache's ideal and the reuse
model's expected, as bars on a log axis (so that 4 and 131,111 tokens both read), the verdict, the output
check, the cause in the server's words and the model's, and the prefill seconds (n/a for a step stopped
once its count was known), flagged when the machine was loaded before the step; and where its prompt first
differed from what the slot held, beside the position the server resumed from.

The bars are inline SVG written here: a few rectangles per row need no chart library, and the page then
opens from ``file://`` with no request outside it. Records hold no prompt text, so neither can the page:
lengths, counts, hashes and the server's numbers only.
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reusebench import records
from reusebench.budget import prefill_budgets
from reusebench.check.verdicts import Verdict
from reusebench.config.sizes import size_label
from reusebench.machine.host import under_load
from reusebench.records import Record, Role, RunKind, StepVerdict, run_kind, was_interrupted
from reusebench.report import markdown_html, replay_view, run_kinds, run_report, service_report
from reusebench.report.run_kinds import CHECK_FILE, WHATIF_FILE
from reusebench.reuse import verification
from reusebench.run import provenance

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
.loaded { background: #fdebd0; } tr.differs td:first-child { font-weight: 600; color: #b03a2e; }
.verdict-ACTIVE { color: #1e8449; } .verdict-DISABLED, .verdict-UNSUPPORTED, .verdict-UNSAFE, .verdict-INEFFECTIVE { color: #b03a2e; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; vertical-align: middle; }
.muted { color: #777; } .warning { color: #b03a2e; font-weight: 600; }
.cards { display: flex; gap: 12px; margin: 0.5em 0; } .card { border: 1px solid #ddd; padding: 8px 14px; }
.card b { font-size: 20px; } text.lane { font-size: 12px; fill: #555; } pre { background: #f8f8f8; padding: 8px; }
"""


def write_run_page(run_dir: Path) -> Path:
    """The run's page, from its records.jsonl and its stamp (run.json: the launch options, the corpus); returns
    its path."""
    run_records = records.read_records(run_dir / "records.jsonl")
    page = run_dir / PAGE
    page.write_text(render_run(run_dir.name, run_records, provenance.read(run_dir), run_kinds.of_run(run_dir)))
    return page


def write_check_page(run_dir: Path, reports: Sequence[dict[str, Any]]) -> Path:
    """A check's page: one row per option, one column per variant, the rows whose verdicts differ marked, each
    verdict's evidence on demand. `reports` are ``check --json``'s (``CHECK_FILE`` in the run directory)."""
    (run_dir / CHECK_FILE).write_text(json.dumps(list(reports), indent=2) + "\n")
    page = run_dir / PAGE
    page.write_text(render_check(run_dir.name, reports))
    return page


def render_check(run_id: str, reports: Sequence[dict[str, Any]]) -> str:
    by_key: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)  # option key -> variant -> verdict
    for report in reports:
        for v in report["verdicts"]:
            key = f"{v['option']}[{v['aspect']}]" if v.get("aspect") else v["option"]
            by_key[key][report["variant"]] = v
    variants = [report["variant"] for report in reports]
    rows = []
    for key, found in by_key.items():
        differs = len({found[name]["verdict"] if name in found else None for name in variants}) > 1
        cells = "".join(_verdict_cell(found.get(name)) for name in variants)
        rows.append(f"<tr class='{'differs' if differs else ''}' data-option='{_e(key)}'><td>{_e(key)}"
                    f"{' (differs)' if differs else ''}</td>{cells}</tr>")
    launches = "".join(f"<li>{_e(r['variant'])}: {_e(r['binary'])}, build {_e(r['build'])}; the check adds "
                       f"{_e(' '.join(r['added_args']) or 'nothing')}"
                       + (f" <b class=verdict-UNEXPECTED>INCOMPLETE: {_e(r['incomplete'])}</b>"
                          if r.get("incomplete") else "") + "</li>" for r in reports)
    profile = ", ".join(dict.fromkeys(r["profile"] for r in reports))
    body = (f"<h1>reusebench check {_e(run_id)}: {_e(profile)}</h1><ul class=muted>{launches}</ul>"
            "<table class=check><tr><th>option</th>" + "".join(f"<th>{_e(name)}</th>" for name in variants)
            + "</tr>" + "".join(rows) + "</table>")
    return _page(f"reusebench check {run_id}", body)


def _verdict_cell(v: dict[str, Any] | None) -> str:
    if v is None:
        return "<td>-</td>"
    evidence = "".join(f"<li>{_e(line)}</li>" for line in v["evidence"])
    return (f"<td class='verdict-{_e(v['verdict'])}'><details><summary>{_e(v['verdict'])} ({_e(v['value'])})"
            f"</summary><ul>{evidence}</ul></details></td>")


def write_index(results_dir: Path) -> Path:
    """``results/index.html``: every run under ``results/runs`` that has a page, newest first, with its status: a
    failed or interrupted run, a check's failing verdicts, a prediction's verification (linked)."""
    runs = [run_dir for run_dir in sorted((results_dir / "runs").glob("*/"), reverse=True) if (run_dir / PAGE).is_file()]
    stamps = {run_dir.name: provenance.read(run_dir) for run_dir in runs}
    verified_by = {stamp.selection["prediction"]: run_id for run_id, stamp in stamps.items()
                   if stamp is not None and stamp.selection.get("prediction")}
    rows = []
    for run_dir in runs:
        kind = run_kinds.of_run(run_dir)
        stamp = stamps[run_dir.name]
        profile = Path(stamp.profile).stem if stamp is not None else ""
        if kind is RunKind.WHATIF:
            found = json.loads((run_dir / WHATIF_FILE).read_text())
            what, profiles = kind.value, f"{profile} (trace {found['trace']['name']})"
            sessions, count = len(found["ranked"]), found["trace"]["requests"]
            verification = verified_by.get(run_dir.name)
            status = (f'verified: <a href="runs/{_e(verification)}/{PAGE}">{_e(verification)}</a>' if verification
                      else "predicted, not verified")
        elif kind is RunKind.CHECK:
            reports = json.loads((run_dir / CHECK_FILE).read_text())
            what, profiles = "option check", ", ".join(dict.fromkeys(r["profile"] for r in reports))
            sessions, count = len(reports), sum(len(r["verdicts"]) for r in reports)
            status = _e(_check_status(reports))
        else:
            rs = records.read_records(run_dir / "records.jsonl")
            what = kind.value
            profiles = ", ".join(dict.fromkeys(r.profile for r in rs))
            sessions, count = len({r.session for r in rs}), len(rs)
            status = _e(_records_status(rs))
        rows.append(f'<tr><td><a href="runs/{_e(run_dir.name)}/{PAGE}">{_e(run_dir.name)}</a></td><td>{what}</td>'
                    f"<td>{status}</td><td>{_e(profiles)}</td><td class=n>{sessions}</td><td class=n>{count}</td></tr>")
    body = ("<h1>reusebench runs</h1><table><tr><th>run</th><th>kind</th><th>status</th><th>profiles</th>"
            "<th>sessions (variants)</th><th>records (verdicts)</th></tr>" + "".join(rows) + "</table>")
    index = results_dir / PAGE
    index.write_text(_page("reusebench runs", body))
    return index


def _records_status(rs: Sequence[Record]) -> str:
    """"ok", "interrupted", "3 failed" (calls that got no answer), or "no records"."""
    if not rs:
        return "no records"
    if any(was_interrupted(r.error) for r in rs):
        return "interrupted"
    failed = sum(bool(r.error) for r in rs)
    unexpected = sum(r.verdict == StepVerdict.UNEXPECTED for r in rs)
    said = [f"{failed} failed"] * bool(failed) + [f"{unexpected} UNEXPECTED"] * bool(unexpected)
    return ", ".join(said) or "ok"


def _check_status(reports: Sequence[dict[str, Any]]) -> str:
    """"incomplete", or the verdicts that fail a check ("1 UNSAFE, 2 DISABLED"), or "ok"."""
    if any(r.get("incomplete") for r in reports):
        return "incomplete"
    verdicts = Counter(v["verdict"] for r in reports for v in r["verdicts"])
    failing = [f"{verdicts[v.value]} {v.value}" for v in (Verdict.UNSAFE, Verdict.UNSUPPORTED, Verdict.DISABLED,
                                                          Verdict.INEFFECTIVE) if verdicts[v.value]]
    return ", ".join(failing) or "ok"


def render_run(run_id: str, run_records: Sequence[Record], stamp: provenance.Stamp | None = None,
               kind: RunKind | None = None) -> str:
    """A scenario run (per session, its steps as bars), a workload's or a tap's (per run of it, the service view)
    or a replay, by its `kind` (default: from its records), with what it launched where its stamp says."""
    sessions: dict[str, list[Record]] = defaultdict(list)
    for r in run_records:
        sessions[r.session].append(r)
    kind = kind or run_kind.guessed(run_records)
    if kind is RunKind.REPLAY:
        return _page(f"reusebench run {run_id}", f"<h1>reusebench replay {_e(run_id)}</h1>{_launches(stamp)}"
                     f"{replay_view.legend()}{replay_view.render(run_records)}")
    workload = kind in (RunKind.WORKLOAD, RunKind.TAP)
    parts = [f"<h1>reusebench {'workload ' if workload else ''}run {_e(run_id)}</h1>",
             _launches(stamp), _timeline_legend() if workload else _legend()]
    for name, rs in sessions.items():
        parts.append(_service(name, rs) if workload else _session(name, rs))
    return _page(f"reusebench run {run_id}", "\n".join(parts))


def _launches(stamp: provenance.Stamp | None) -> str:
    """Each variant's launch options as the profile wrote them, its build, and the corpus: what the figures are of."""
    if stamp is None:
        return ""
    items = "".join(
        f"<li>{_e(name)}: llama-server {_e(build)}; options "
        f"{_e(' '.join(f'--{k}' if v is True else f'--{k} {v}' for k, v in stamp.options.get(name, {}).items()) or 'none')}"
        f"</li>" for name, build in stamp.binaries.items())
    corpus = f"<p class=muted>corpus: {_e(stamp.corpus)}</p>" if stamp.corpus else ""
    return f"<ul class=launches>{items}</ul>{corpus}"


def _session(name: str, rs: list[Record]) -> str:
    measured = [r for r in rs if r.role == Role.MEASURE]
    first = rs[0]
    budget = next(iter(prefill_budgets(rs)), None)
    head = (f"<h2>{_e(first.profile)} [{_e(first.variant)}] at {size_label(first.size)}</h2>"
            f"<p class=muted>{_e(name)}; build {_e(first.build)}; model {_e(first.model)}"
            + (f"; {_e(budget.line().split(': ', 1)[1])}" if budget else "") + _noise_band(rs) + "</p>"
            + "".join(f"<p class=warning>{_e(line)}</p>" for line in run_report.plainly(rs)))
    if not measured:
        return head + "<p>no measured step</p>"
    scale = max(r.prompt_tokens or 1 for r in measured)
    images = any(r.extra.get("image_spans") for r in measured)
    rows = "".join(_row(r, scale, images) for r in measured)
    return (head + "<table class=steps><tr><th>step</th><th>tokens (log axis)</th><th>re-processed / ideal / "
            "expected</th><th>diverged at / resumed at</th><th>verdict</th><th>output</th><th>why</th>"
            "<th>model's why</th><th>prefill s</th>" + ("<th>images</th>" if images else "")
            + "<th>machine before and during</th></tr>" + rows + "</table>")


def _images(r: Record) -> str:
    """Images after what the step kept, of those sent, with their tokens; those the log shows encoded, and the
    seconds."""
    again, tokens, encoded, seconds = run_report.image_cells(r)
    how = "not encoded: stopped at its count" if r.prompt_ms is None else f"encoded {_e(encoded)}" + (
        "" if seconds == "-" else f" in {_e(seconds)} s")
    return f"<td class=n>{_e(again)} re-processed ({_e(tokens)} tokens); {how}</td>"


def _noise_band(rs: list[Record]) -> str:
    """The session's noise band, where a reused output was not identical to its reference."""
    summary = next((r for r in rs if r.role == Role.SESSION), None)
    noise = summary.extra.get("noise") if summary else None
    if not noise:
        return ""
    return (f"; noise band {noise['noise_band']:.2g} (largest probability difference of the no-reuse output at "
            f"ubatch {noise['n_ubatch']:.0f}; a reused output within {verification.NOISE_MARGIN:g} times it is "
            "the same)")


def _row(r: Record, scale: int, images: bool = False) -> str:
    if r.error:
        return (f"<tr data-step='{_e(r.scenario)}/{_e(r.step)}'><td>{_e(r.scenario)}/{_e(r.step)}</td>"
                f"<td colspan={10 if images else 9}>failed: {_e(r.error)}</td></tr>")
    load = under_load(r.host)
    seconds = "n/a (stopped at its count)" if r.prompt_ms is None else f"{r.prompt_ms / 1000:.2f}"
    numbers = " / ".join("-" if getattr(r, field) is None else f"{getattr(r, field):,}" for _, field, _ in BARS)
    verdict = r.verdict or ""
    return (f"<tr data-step='{_e(r.scenario)}/{_e(r.step)}'><td>{_e(r.scenario)}/{_e(run_report.step_label(r))}</td>"
            f"<td>{_bars(r, scale)}</td><td class=n>{numbers}</td><td class=n>{_positions(r)}</td>"
            f"<td class='verdict-{_e(verdict.split()[0] if verdict else '')}'>{_e(verdict)}</td>"
            f"<td>{_e(run_report.correctness(r))}</td><td>{_e(run_report.cause_words(r))}</td>"
            f"<td>{_e(r.cause_expected or '')}</td>"
            f"<td class='n{' loaded' if load else ''}' title='{_e(load or '')}'>{seconds}"
            f"{' (under load)' if load else ''}</td>" + (_images(r) if images else "")
            + f"<td class=machine>{_e(machine_state(r))}</td></tr>")


def machine_state(r: Record) -> str:
    """The host's load before the step, and the GPU's state over it where there is a GPU: what explains a spread."""
    host, gpu = r.host or {}, r.gpu or {}
    parts = [] if host.get("load_avg_1m") is None else [f"load {host['load_avg_1m']:.2f} on {host.get('cpu_count')} cores"]
    if gpu.get("start_temperature_c") is not None:
        parts.append(f"GPU from {gpu['start_temperature_c']} °C")
    if gpu.get("sm_clock_mean_mhz") is not None:
        parts.append(f"SM {gpu['sm_clock_mean_mhz']:,.0f} MHz")
    if gpu.get("throttled_fraction") is not None:
        parts.append(f"throttled {100 * gpu['throttled_fraction']:.0f}% of readings")
    return ", ".join(parts) or "-"


def _positions(r: Record) -> str:
    """Where the prompt first differed from what the slot held, and the position the server resumed from (its
    cache_n: a checkpoint, or the common prefix); "-" for records from before the divergence was kept."""
    diverged = r.extra.get("diverges_at")
    return "-" if diverged is None else f"{diverged:,} / {r.cache_n or 0:,}"


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


# -- a workload run: cards, the timeline with a lane per slot, the requests by user ------------------------

OUTCOME_COLOURS = {"hit": "#27ae60", "partial": "#e67e22", "miss": "#c0392b", "cannot hit": "#7f8c8d",
                   "probe": "#8e44ad", "setup": "#bdc3c7"}
TIMELINE_WIDTH, LANE_HEIGHT, LABEL_WIDTH = 1100, 26, 60


def _service(name: str, rs: list[Record]) -> str:
    summary = next((r for r in rs if r.role == Role.SESSION), None)
    calls = sorted((r for r in rs if r.user is not None and r.endpoint and not r.error), key=lambda r: r.started_at)
    outcomes = {id(t.record): t for t in service_report.turns(rs)}
    should = [t for t in outcomes.values() if t.should_hit]
    missed = sum(t.outcome == StepVerdict.MISS for t in should)
    partial = sum(t.outcome == StepVerdict.PARTIAL for t in should)
    probes = [r for r in calls if r.role == Role.PROBE]
    cards = (("requests", f"{len(calls)}"), ("users", f"{len({r.user for r in calls if r.role != Role.PROBE})}"),
             ("health checks", f"{len(probes)}"),
             ("time prefilling", f"{sum(r.prompt_ms or 0 for r in calls) / 1000:.1f} s"),
             ("tokens computed fresh", f"{sum(r.prompt_n or 0 for r in calls):,}"),
             ("should-hit turns missed", f"{missed} of {len(should)}"),
             ("should-hit turns partial", f"{partial} of {len(should)}"))
    head = f"<h2>{_e(summary.scenario if summary else name)} on {_e(calls[0].profile if calls else '')}</h2>"
    return (head + "<div class=cards>" + "".join(f"<div class=card><b>{_e(v)}</b><br>{_e(k)}</div>" for k, v in cards)
            + "</div>" + _timeline(calls, outcomes) + _by_user(calls, outcomes)
            + f"<h3>Miss classes and causes</h3>{markdown_html.to_html(service_report.render(rs))}")


def _kind(r: Record, outcomes: dict[int, service_report.Turn]) -> str:
    if r.role == Role.PROBE:
        return "probe"
    turn = outcomes.get(id(r))
    if turn is None:
        return "setup"
    return turn.outcome if turn.should_hit else "cannot hit"


def _timeline(calls: list[Record], outcomes: dict[int, service_report.Turn]) -> str:
    """One lane per slot: each request a bar from its start to its end, its prefill part the full-height
    part (the server's prompt time, before its decoding), coloured by outcome."""
    if not calls:
        return ""
    start, end = calls[0].started_at, max(r.ended_at for r in calls)
    span = max(end - start, 1e-3)
    slots = sorted({r.slot for r in calls if r.slot is not None})
    lane = {slot: i for i, slot in enumerate(slots)}

    def x(t: float) -> float:
        return LABEL_WIDTH + (TIMELINE_WIDTH - LABEL_WIDTH) * (t - start) / span

    shapes = [f"<text x='0' y='{i * LANE_HEIGHT + 17}' class='lane slot'>slot {slot}</text>" for slot, i in lane.items()]
    for r in calls:
        if r.slot is None:
            continue
        y = lane[r.slot] * LANE_HEIGHT + 3
        kind = _kind(r, outcomes)
        (prefill_start, decode_start), _ = service_report.spans(r)
        prefill_start = max(prefill_start, r.started_at)
        label = (f"{r.user} {r.step}: {r.prompt_n or 0:,} re-processed of {r.prompt_tokens or 0:,}, "
                 f"{(r.wall_ms or 0) / 1000:.2f} s ({kind})")
        shapes.append(
            f"<g class=request data-user='{_e(r.user)}' data-slot='{r.slot}' data-role='{_e(r.role)}' "
            f"data-outcome='{_e(kind)}' data-prefill-ms='{r.prompt_ms or 0:.1f}'><title>{_e(label)}</title>"
            f"<rect x='{x(r.started_at):.2f}' y='{y + 6}' width='{max(x(r.ended_at) - x(r.started_at), 1):.2f}' "
            f"height='{LANE_HEIGHT - 18}' fill='{OUTCOME_COLOURS[kind]}' opacity='0.45'/>"
            f"<rect class=prefill x='{x(prefill_start):.2f}' y='{y}' "
            f"width='{max(x(decode_start) - x(prefill_start), 1):.2f}' height='{LANE_HEIGHT - 6}' "
            f"fill='{OUTCOME_COLOURS[kind]}'/></g>")
    height = len(slots) * LANE_HEIGHT + 20
    axis = f"<text x='{LABEL_WIDTH}' y='{height - 4}' class=lane>0 s</text>" \
           f"<text x='{TIMELINE_WIDTH - 60}' y='{height - 4}' class=lane>{span:.1f} s</text>"
    return (f"<h3>Timeline, one lane per slot</h3><svg class=timeline data-seconds='{span:.3f}' "
            f"width='{TIMELINE_WIDTH}' height='{height}'>"
            + "".join(shapes) + axis + "</svg>")


def _by_user(calls: list[Record], outcomes: dict[int, service_report.Turn]) -> str:
    users: dict[str, list[Record]] = defaultdict(list)
    for r in calls:
        users[r.user or ""].append(r)
    parts = ["<h3>Requests by user</h3>"]
    for user, rs in users.items():
        rows = "".join(
            f"<tr data-user='{_e(user)}'><td>{_e(r.step)}</td><td class=n>{'' if r.slot is None else r.slot}</td>"
            f"<td>{_e(_kind(r, outcomes))}</td>"
            f"<td>{_e(outcomes[id(r)].route if id(r) in outcomes else '')}</td>"
            f"<td class=n>{r.prompt_n or 0:,} / {r.ideal if r.ideal is not None else '-'}</td>"
            f"<td class=n>{_logged_divergence(r)}</td>"
            f"<td>{_e(outcomes[id(r)].cause or '' if id(r) in outcomes else '')}</td>"
            f"<td>{_e((r.cause or {}).get('summary', ''))}</td></tr>" for r in rs)
        parts.append(f"<details><summary>{_e(user)}: {len(rs)} requests</summary><table><tr><th>step</th>"
                     "<th>slot</th><th>outcome</th><th>path</th><th>re-processed / ideal</th>"
                     "<th>diverged at / resumed at</th><th>miss cause</th>"
                     f"<th>the log says</th></tr>{rows}</table></details>")
    return "".join(parts)


def _logged_divergence(r: Record) -> str:
    """A workload holds no model of the slots: where the prompt left what the server held is the common prefix
    its log reports when it chose the slot or RAM entry (f_sim, a fraction of the prompt), beside cache_n."""
    cause = r.cause or {}
    f_sim = cause.get("ram_f_sim") if cause.get("ram_restored") else cause.get("f_sim")
    if f_sim is None or not r.prompt_tokens:
        return f"- / {r.cache_n or 0:,}"
    return f"~{round(f_sim * r.prompt_tokens):,} / {r.cache_n or 0:,}"


def _timeline_legend() -> str:
    keys = "".join(f"<span style='background:{colour}'></span>{kind}" for kind, colour in OUTCOME_COLOURS.items())
    return (f"<p class=legend>{keys} &nbsp; a bar spans a request from its start to its end; its full-height part is "
            "the server's prefill</p>")


def _legend() -> str:
    keys = "".join(f"<span style='background:{colour}'></span>{label}" for label, _, colour in BARS)
    return (f"<p class=legend>{keys} &nbsp; bars on a log axis: each tenfold more tokens adds the same length; a "
            "shaded prefill time means the machine was loaded before the step</p>")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)

