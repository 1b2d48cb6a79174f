"""What `whatif` prints: the combinations ranked by the tokens they would re-process over the trace, each with its
misses by where the request would be served from, its prefill seconds at this box's rate and its gain over the
profile as it is; those left out, and why; as a table, as JSON, and as a page with one bar per combination."""

from __future__ import annotations

import html
import json
import textwrap
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from reusebench.records import Served
from reusebench.report import view
from reusebench.run.recording import RunDir
from reusebench.whatif.prediction import Outcome
from reusebench.whatif.rate import PrefillRate

BAR_WIDTH = 520


def ranked(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The predicted ones, fewest re-processed tokens first (the profile as it is first among equals)."""
    found = [o for o in outcomes if o.prediction is not None]
    return sorted(found, key=lambda o: (o.prediction.reprocessed if o.prediction else 0, bool(o.combination.setting)))


def _as_it_is(outcomes: Sequence[Outcome]) -> Outcome | None:
    return next((o for o in outcomes if not o.combination.setting and o.prediction is not None), None)


def rows(outcomes: Sequence[Outcome], rate: PrefillRate) -> list[dict[str, Any]]:
    base = _as_it_is(outcomes)
    base_tokens = base.prediction.reprocessed if base and base.prediction else None
    found = []
    for rank, o in enumerate(ranked(outcomes), 1):
        p = o.prediction
        assert p is not None
        found.append({"rank": rank, "combination": o.combination.label, "setting": dict(o.combination.setting),
                      "reprocessed": p.reprocessed, "ideal": p.ideal, "over_ideal": p.excess,
                      "over_ideal_by_class": {name.value: p.excess_by_class[name] for name in Served
                                              if p.excess_by_class[name]},
                      "prefill_s": round(rate.seconds_for(p.reprocessed), 3),
                      "gain_s": None if base_tokens is None else round(rate.seconds_for(base_tokens - p.reprocessed), 3),
                      "slots": o.spec.n_slots, "slot_context": o.spec.launch.slot_ctx})
    return found


LAUNCH_WIDTH, SERVED_WIDTH = 20, 18  # where a table must fit a terminal, these columns wrap in their cells


def render_text(outcomes: Sequence[Outcome], rate: PrefillRate, *, trace_line: str, width: int | None = None) -> str:
    """The ranking as text; with `width`, every line fits it (long launches and classes wrap in their cells)."""
    table = [[r["rank"], r["combination"], f"{r['reprocessed']:,}", f"{r['over_ideal']:,}",
              ", ".join(f"{k} {v:,}" for k, v in r["over_ideal_by_class"].items()) or "-",
              f"{r['prefill_s']:,.1f}", _gain(r["gain_s"]).removesuffix(" s")]
             for r in rows(outcomes, rate)]
    headers = ["#", "launch", "re-processed", "over ideal", "over ideal by where served", "prefill s", "gain s"]
    lines = [trace_line, f"prefill rate: {rate.describe()}", "",
             tabulate(table, headers=headers, tablefmt="github", disable_numparse=True) if width is None else
             tabulate(table, headers=[*headers[:4], "by where served", *headers[5:]], tablefmt="simple",
                      disable_numparse=True, maxcolwidths=[None, LAUNCH_WIDTH, None, None, SERVED_WIDTH, None, None])]
    ideal = next((o.prediction.ideal for o in outcomes if o.prediction), None)
    if ideal is not None:
        lines.append(f"\nideal (the trace's own unbounded prefix cache): {ideal:,} tokens re-processed")
    lines += [f"left out: {o.combination.label}: {o.skipped}" for o in outcomes if o.prediction is None]
    lines += sorted({note for o in outcomes for note in o.notes})
    if width is not None:
        lines = [line if "\n" in line else textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False)
                 for line in lines]
    return "\n".join(lines)


def render_json(outcomes: Sequence[Outcome], rate: PrefillRate, *, trace: dict[str, Any]) -> str:
    return json.dumps({"trace": trace, "rate": {"tokens": rate.tokens, "seconds": round(rate.seconds, 3),
                                                 "source": rate.source},
                       "ranked": rows(outcomes, rate),
                       "left_out": [{"combination": o.combination.label, "why": o.skipped}
                                    for o in outcomes if o.prediction is None],
                       "notes": sorted({note for o in outcomes for note in o.notes})}, indent=2)


def render_page(outcomes: Sequence[Outcome], rate: PrefillRate, *, title: str, trace_line: str,
                verification: RunDir | None = None) -> str:
    """The ranking as bars, and a link to the replay that verified it (a sibling run directory) once there is one."""
    found = rows(outcomes, rate)
    top = max((r["prefill_s"] for r in found), default=0.0) or 1.0
    bars = "".join(
        f"<tr data-combination='{_e(r['combination'])}'><td class=n>{r['rank']}</td><td>{_e(r['combination'])}</td>"
        f"<td><svg width='{BAR_WIDTH}' height='14'><rect width='{BAR_WIDTH * r['prefill_s'] / top:.1f}' height='12' "
        f"fill='{'#2c3e50' if r['combination'] != 'as it is' else '#7f8c8d'}'/></svg></td>"
        f"<td class=n>{r['prefill_s']:,.1f} s</td><td class=n>{r['reprocessed']:,}</td>"
        f"<td class=n>{_gain(r['gain_s'])}</td></tr>"
        for r in found)
    left = "".join(f"<li>{_e(o.combination.label)}: {_e(o.skipped)}</li>" for o in outcomes if o.prediction is None)
    body = (f"<h1>{_e(title)}</h1><p>{_e(trace_line)}</p><p class=muted>prefill rate: {_e(rate.describe())}</p>"
            "<table class=whatif><tr><th>#</th><th>launch</th><th>predicted prefill seconds</th><th></th>"
            f"<th>re-processed</th><th>gain</th></tr>{bars}</table>" + (f"<p>left out:</p><ul>{left}</ul>" if left else "")
            + (f"<p class=verified>verified by a replay of the best launches: <a href='../{_e(verification.run_id)}/"
               f"{view.PAGE}'>run {_e(verification.run_id)}</a></p>" if verification else ""))
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_e(title)}</title><style>"
            "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em} td,th{padding:3px 8px;text-align:left} "
            "td.n{text-align:right} .muted{color:#777}</style></head><body>" + body + "</body></html>\n")


def _gain(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:+,.1f} s"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
