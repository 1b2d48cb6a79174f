"""What a trace replay shows: the trace's ideal reuse beside what the reuse model expected and what the server
delivered, the tokens over the ideal by where the request was served from, and the prefill seconds they cost.

Read from the records alone (``run.replay`` writes them). A request's miss class comes from the server's log
(``cause``): the slot it got held a shorter prefix (``slot kept``), the RAM cache gave back a shorter one (``RAM
cache``), a checkpoint short of the shared prefix or none (``checkpoint``), or nothing held it: gone from a cache
that had it (``evicted``), or nowhere to keep it, with the RAM cache off (``not held``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from reusebench.records import Record, Role, RunKind, Served, served_by_log


@dataclass
class ReplayFigures:
    """One replayed session's sums."""

    session: str
    mode: str
    requests: int = 0
    prompt_tokens: int = 0
    ideal: int = 0
    expected: int = 0
    measured: int = 0
    prefill_s: float = 0.0
    excess_s: float = 0.0  # the prefill seconds of the tokens over the ideal, at each request's own rate
    excess_by_class: Counter[Served] = field(default_factory=Counter)  # tokens over the ideal, by where served
    expected_by_class: Counter[Served] = field(default_factory=Counter)  # the same, as the reuse model predicted
    differ: list[Record] = field(default_factory=list)  # measured != expected
    not_forced: int = 0  # answers the server did not give as forced: the model was told another slot
    failed: int = 0
    skipped_too_long: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"session": self.session, "mode": self.mode, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "ideal": self.ideal, "expected": self.expected,
                "measured": self.measured, "prefill_s": round(self.prefill_s, 3), "excess_s": round(self.excess_s, 3),
                "excess_by_class": dict(self.excess_by_class), "expected_by_class": dict(self.expected_by_class),
                "differ": len(self.differ),
                "first_difference": self.differ[0].turn if self.differ else None, "not_forced": self.not_forced,
                "failed": self.failed, "skipped_too_long": self.skipped_too_long}


def figures(rs: Sequence[Record]) -> list[ReplayFigures]:
    by_session: dict[str, list[Record]] = defaultdict(list)
    for r in rs:
        if r.scenario == RunKind.REPLAY:
            by_session[r.session].append(r)
    return [_figures(name, session) for name, session in by_session.items()]


def _figures(name: str, rs: list[Record]) -> ReplayFigures:
    summary = next((r for r in rs if r.role == Role.SESSION), None)
    extra = summary.extra if summary else {}
    found = ReplayFigures(name, str(extra.get("mode", rs[0].extra.get("mode", ""))),
                          skipped_too_long=extra.get("skipped_too_long", 0),
                          expected_by_class=Counter({Served(k): v for k, v in
                                                     extra.get("expected_by_class", {}).items()}))
    ram_cache = bool(extra.get("ram_cache", True))
    for r in rs:
        if r.role != Role.MEASURE:
            continue
        if r.error or r.prompt_n is None:
            found.failed += 1
            continue
        found.requests += 1
        found.prompt_tokens += r.prompt_tokens or 0
        found.ideal += r.ideal or 0
        found.expected += r.expected or 0
        found.measured += r.prompt_n
        seconds = (r.prompt_ms or 0.0) / 1000
        found.prefill_s += seconds
        excess = r.prompt_n - (r.ideal or 0)
        if excess > 0:
            found.excess_by_class[served_by_log(r.cause, ram_cache)] += excess
            found.excess_s += seconds * excess / r.prompt_n
        if r.expected is not None and r.expected != r.prompt_n:
            found.differ.append(r)
        if r.extra.get("answer_forced") is False:
            found.not_forced += 1
    return found


def render(rs: Sequence[Record]) -> str:
    parts = []
    for f in figures(rs):
        rows = [["requests", f"{f.requests:,}"], ["prompt tokens", f"{f.prompt_tokens:,}"],
                ["re-processed, ideal (the trace's unbounded prefix cache)", f"{f.ideal:,}"],
                ["re-processed, expected (reuse model)", f"{f.expected:,}"],
                ["re-processed, measured", f"{f.measured:,}"],
                ["over the ideal", f"{f.measured - f.ideal:,} ({_share(f.measured - f.ideal, f.prompt_tokens)} of "
                 "the prompt tokens)"],
                ["prefill seconds", f"{f.prefill_s:.1f} s, of which over the ideal {f.excess_s:.1f} s"]]
        rows += [[f"  over the ideal: {name}", f"{f.excess_by_class[name]:,} (expected {f.expected_by_class[name]:,})"]
                 for name in Served if f.excess_by_class[name] or f.expected_by_class[name]]
        lines = [f"### {f.session} ({f.mode})", "", tabulate(rows, tablefmt="github", headers=["", ""]), ""]
        if f.differ:
            first = f.differ[0]
            lines.append(f"measured differs from expected on {len(f.differ)} of {f.requests} requests; first: "
                         f"request {first.turn} ({first.step}): expected {first.expected:,} ({first.cause_expected}), "
                         f"measured {first.prompt_n:,} ({(first.cause or {}).get('summary', 'no log')})")
        else:
            lines.append(f"measured equals expected on every one of {f.requests} requests")
        if f.not_forced:
            lines.append(f"{f.not_forced} answer(s) were not the forced token: the model was told another slot content")
        if f.failed:
            lines.append(f"{f.failed} request(s) failed")
        if f.skipped_too_long:
            lines.append(f"{f.skipped_too_long} request(s) longer than a slot's context were not sent")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"
