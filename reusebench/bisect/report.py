"""A bisect's findings for people and scripts: one dict per change (with the commits between its two builds),
and the table `reusebench bisect`, the nightly and the history print."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from reusebench.bisect.builds import Builds, pull_requests
from reusebench.bisect.search import Change, Search


def change_record(builds: Builds, change: Change) -> dict[str, Any]:
    commits = builds.between(change.held, change.changed)
    return {"figure": str(change.key), "variant": change.key.variant, "size": change.key.size,
            "step": change.key.step, "kind": change.key.kind,
            "last_held": change.held.name, "held_value": change.held_value,
            "first_changed": change.changed.name, "changed_value": change.changed_value,
            "skipped": [p.name for p in change.skipped], "commits": commits,
            "pull_requests": pull_requests(commits)}


def summary(builds: Builds, search: Search, changes: list[Change], seconds: float) -> dict[str, Any]:
    """What a bisect did and found: the builds, those it measured (and why any gave no figures), the changes."""
    return {
        "builds": [p.name for p in builds.points],
        "measured": [{"build": builds.points[i].name, "failed": search.measured[i].failed,
                      "not_applicable": search.measured[i].not_applicable, "run": search.measured[i].run}
                     for i in sorted(search.measured)],
        "seconds": round(seconds, 1),
        "changes": [change_record(builds, change) for change in changes],
    }


HEADERS = ("step", "figure", "where", "last held", "value", "first changed", "value", "skipped")


def row(change: dict[str, Any]) -> list[str]:
    """One change as a table's row, under HEADERS."""
    return [change["step"], change["kind"], f"{change['variant']} @ {change['size']}", change["last_held"],
            value_cell(change["held_value"]), change["first_changed"], value_cell(change["changed_value"]),
            ", ".join(change["skipped"])]


def render(changes: list[dict[str, Any]], first: str, last: str) -> str:
    """The changes as a table, then per pair of builds the commits between them."""
    if not changes:
        return f"{first} -> {last}: every figure the same; nothing to bisect"
    lines = [tabulate([row(c) for c in changes], headers=HEADERS, tablefmt="github")]
    for held, changed in dict.fromkeys((c["last_held"], c["first_changed"]) for c in changes):
        commits = next(c["commits"] for c in changes if (c["last_held"], c["first_changed"]) == (held, changed))
        lines.append(f"\n{held} -> {changed}: " + (f"{len(commits)} commit(s)" if commits else
                     f"its commits: `git log --first-parent {held}..{changed}` in a llama.cpp clone"))
        lines += [f"  {subject}" for subject in commits]
    return "\n".join(lines)


def value_cell(value: int | None) -> str:
    """A figure as a table shows it: n/a where the step did not apply."""
    return "n/a" if value is None else f"{value:,}"
