"""A trace replay on the run's page: its figures as cards, and the tokens re-processed over the trace's time.

The plot draws three cumulative lines over the requests' arrival times (the trace's own, so a serial replay and a
timed one read on one axis): what the trace's unbounded prefix cache would re-process (ideal), what the reuse
model expected, and what the server measured. Where measured leaves expected, the request is marked. Inline SVG,
as the rest of the page: no text of any prompt, only counts and times.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from reusebench.records import Record, Role
from reusebench.report import markdown_html, replay_report

WIDTH, HEIGHT, PAD = 900, 260, 50
LINES = (("ideal", "ideal", "#27ae60"), ("expected", "expected", "#2c3e50"), ("measured", "prompt_n", "#c0392b"))


def render(rs: Sequence[Record]) -> str:
    parts = []
    for f in replay_report.figures(rs):
        session = [r for r in rs if r.session == f.session and r.role == Role.MEASURE and r.prompt_n is not None]
        cards = (("requests", f"{f.requests:,}"), ("ideal", f"{f.ideal:,}"), ("expected", f"{f.expected:,}"),
                 ("measured", f"{f.measured:,}"), ("prefill", f"{f.prefill_s:.1f} s"),
                 ("over the ideal", f"{f.excess_s:.1f} s"), ("measured ≠ expected", f"{len(f.differ)}"))
        parts.append(f"<h2>{_e(f.session)} ({_e(f.mode)})</h2><div class=cards>"
                     + "".join(f"<div class=card><b>{_e(v)}</b><br>{_e(k)}</div>" for k, v in cards) + "</div>"
                     + _plot(session) + markdown_html.to_html(replay_report.render([r for r in rs
                                                                                     if r.session == f.session])))
    return "".join(parts)


def legend() -> str:
    keys = "".join(f"<span style='background:{colour}'></span>{label}" for label, _, colour in LINES)
    return (f"<p class=legend>{keys} &nbsp; tokens re-processed, summed over the trace's time; a ring marks a request "
            "whose measured count differs from the expected one</p>")


def _plot(session: list[Record]) -> str:
    if not session:
        return "<p>no measured request</p>"
    calls = sorted(session, key=lambda r: (r.extra.get("arrival_ms", 0), r.turn or 0))
    times = [r.extra.get("arrival_ms", 0) for r in calls]
    span = max(times[-1] - times[0], 1)
    sums = {name: _cumulative([getattr(r, field) or 0 for r in calls]) for name, field, _ in LINES}
    top = max(max(values) for values in sums.values()) or 1

    def x(t: int) -> float:
        return PAD + (WIDTH - 2 * PAD) * (t - times[0]) / span

    def y(v: int) -> float:
        return HEIGHT - PAD + (2 * PAD - HEIGHT) * v / top

    shapes = [f"<polyline class='line {name}' fill='none' stroke='{colour}' stroke-width='1.5' points='"
              + " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in zip(times, sums[name], strict=True)) + "'/>"
              for name, _, colour in LINES]
    shapes += [f"<circle class=differs cx='{x(t):.1f}' cy='{y(v):.1f}' r='4' fill='none' stroke='#b03a2e'>"
               f"<title>request {r.turn}: expected {r.expected:,}, measured {r.prompt_n:,}</title></circle>"
               for r, t, v in zip(calls, times, sums["measured"], strict=True)
               if r.expected is not None and r.expected != r.prompt_n]
    axis = (f"<text x='{PAD}' y='{HEIGHT - 20}' class=lane>0 s</text><text x='{WIDTH - PAD - 60}' y='{HEIGHT - 20}' "
            f"class=lane>{span / 1000:,.0f} s of trace</text><text x='4' y='{PAD - 8}' class=lane>{top:,} tokens</text>")
    return (f"<svg class=replay width='{WIDTH}' height='{HEIGHT}' data-requests='{len(calls)}'>" + "".join(shapes)
            + axis + "</svg>")


def _cumulative(values: list[int]) -> list[int]:
    total, out = 0, []
    for v in values:
        total += v
        out.append(total)
    return out


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
