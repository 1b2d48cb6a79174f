"""The text reports' Markdown on a page: the subset they write (### headings, GitHub tables, "- " lists, paragraphs,
_emphasis_ lines) as HTML, every piece of text escaped. A page shows the same report as report.md, rendered."""

from __future__ import annotations

import html
import re

TABLE_RULE = re.compile(r"^\|[-:| ]+\|$")


def to_html(text: str) -> str:
    out: list[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = block.splitlines()
        if lines[0].startswith("#"):
            level = min(6, len(lines[0]) - len(lines[0].lstrip("#")))
            out.append(f"<h{level}>{_e(lines[0].lstrip('#').strip())}</h{level}>")
            lines = lines[1:]
        if not lines:
            continue
        if all(line.startswith("|") for line in lines):
            out.append(_table(lines))
        elif all(line.startswith("- ") for line in lines):
            out.append("<ul>" + "".join(f"<li>{_e(line[2:])}</li>" for line in lines) + "</ul>")
        else:
            out.append(f"<p>{_e(' '.join(line.strip() for line in lines).strip('_'))}</p>")
    return "\n".join(out)


def _table(lines: list[str]) -> str:
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines
            if not TABLE_RULE.match(line.strip())]
    head, body = rows[0], rows[1:]
    return ("<table><tr>" + "".join(f"<th>{_e(cell)}</th>" for cell in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in body)
            + "</table>")


def _e(text: str) -> str:
    return html.escape(text.replace("`", ""), quote=True)
