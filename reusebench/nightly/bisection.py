"""After a night: on each branch, where a count changed against the last night, the first commit that changed
it, bisected over the commits between the two nights with the night's own selection (`reusebench.bisect`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any, TextIO

from reusebench import bisect
from reusebench.bisect import report
from reusebench.config import asv_selection
from reusebench.nightly import commits
from reusebench.report import asv_results

RECORDS = "bisect"  # under the results directory: the bisects' runs


def since_last_night(repo: Path, branch: str, tonight: Sequence[str], before: set[str]) -> tuple[str, str] | None:
    """(the newest commit measured before tonight, the branch's newest measured tonight), when both exist."""
    history = commits.git(repo, "rev-list", "--first-parent", branch, "--").split()  # newest first
    newest = next((c for c in history if c in tonight), None)
    last = next((c for c in history if c in before), None)
    return (last, newest) if last and newest else None


def first_changes(repo: Path, branches: Sequence[str], tonight: Sequence[str], before: set[str], asv_dir: Path,
                  machine: str, env: dict[str, str], results: Path, out: TextIO) -> list[dict[str, Any]]:
    """Every count changed since the last night, with the first commit that changed it (one record each)."""
    found: list[dict[str, Any]] = []
    selection = asv_selection.from_env({**env, asv_selection.BUILT_ENV: str(results / "env")})
    probe = bisect.Probe(selection.profile, tuple(selection.variants), tuple(selection.sizes),
                         tuple(selection.scenarios), verify=True, results=results / RECORDS)
    for branch in branches:
        pair = since_last_night(repo, branch, tonight, before)
        if pair is None or not asv_results.count_changes(*(asv_results.stored(asv_dir, c, machine) for c in pair)):
            continue
        print(f"nightly: counts changed on {branch} since {pair[0][:12]}: bisecting", file=out, flush=True)
        builds = bisect.CloneBuilds(repo, *pair)
        search = bisect.Search(builds.points, functools.partial(bisect.measure_build, builds, probe=probe, out=out))
        try:
            found += [{"branch": branch, **report.change_record(builds, search.find(key))} for key in search.differing()]
        except bisect.BisectError as exc:
            print(f"nightly: no bisect on {branch}: {exc}", file=out, flush=True)
    return found


PAGE = "first-changes.html"  # in the site, beside asv's pages


def write_page(html_dir: Path, nights: list[dict[str, Any]]) -> Path:
    """The site's page of every count a night found changed, newest night first, with its first commit."""
    rows = []
    for night in reversed(nights):
        for c in night.get("first_changes", ()):
            commits = "<br>".join(escape(subject) for subject in c["commits"]) or "(none named)"
            rows.append("<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in (
                night["ended"][:10], c["branch"], c["step"], c["kind"], f"{c['variant']} @ {c['size']}",
                c["last_held"], report.value_cell(c["held_value"]), c["first_changed"],
                report.value_cell(c["changed_value"]))) +
                f"<td>{commits}</td></tr>")
    headers = ("night", "branch", "step", "figure", "where", "last held", "value", "first changed", "value", "commits")
    page = html_dir / PAGE
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>reusebench: first changed commits</title>"
        "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 6px}"
        "table{border-collapse:collapse}</style></head><body>"
        "<h1>Counts changed since the night before, and the first commit that changed them</h1>"
        "<p>Each night bisects the commits between its newest commit and the last night's where a count "
        "changed (<code>reusebench bisect</code>). <a href='index.html'>The asv graphs</a>.</p>"
        f"<table><tr>{''.join(f'<th>{h}</th>' for h in headers)}</tr>{''.join(rows) or '<tr><td colspan=10>none yet</td></tr>'}"
        "</table></body></html>\n")
    return page
