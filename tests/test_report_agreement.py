"""The page and the text report say the same of every turn, and what they say is the one rule's
(``records.verdict`` of a scenario's step, ``records.outcome`` of a workload's turn).

`make bench`'s runs at the tests' size, each by the command `make bench` runs, into one results directory:
report A's six scenarios on the control (tiny-llama, at one size) and on the hybrid (tiny-qwen35, make bench's
variant, at two sizes as make bench runs it at two), then report B's service workload (report-b-service, on its
serial schedule), then `reusebench report --last 3`, make bench's last step (narrow tables). For every measured
step, its verdict cell on the run's page (the word and its colour class), its verdict in that text, in the run's
report.md (every column), in `reusebench report --json`, and ``records.verdict`` of its record are one word. For
every request of the workload, the timeline's colour, its tooltip and the by-user table's outcome are the turn's
outcome (``service_report.turns``: ``records.outcome`` with the system prompt shared; "cannot hit" for a turn that
cannot), and that is also the word ``records.verdict`` gives it. The totals each prints agree: a scenario run's
page prints none, so its words counted must give the text's miss rates; a workload's page prints its cards, and
its words counted by kind, by route and by cause must give the text's tables. Pages are read from the written
files with the standard library's html.parser.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reusebench import cli, records
from reusebench.config.sizes import size_label
from reusebench.records import Record, Role
from reusebench.report import run_report, service_report, view

from conftest import REPORT_A, REPORT_A_SIZE

pytestmark = pytest.mark.e2e

HYBRID_VARIANT = "mmproj=on,cache-reuse=256"  # the Makefile's HYBRID_VARIANT
HYBRID_SIZES = (REPORT_A_SIZE, 2 * REPORT_A_SIZE)  # make bench: 32K and 128K; here 2K and 4K
CONTROL_SIZE = REPORT_A_SIZE  # make bench: 32K
WORKLOAD = "report-b-service"
SCENARIOS = [arg for scenario in REPORT_A for arg in ("--scenario", scenario)]

# Report A's eight measured steps (restore_disk measures three) and what each is on the pinned build: the hybrid
# returns to a checkpoint 4 tokens before the end (a hit) or n_ubatch + 4 before it (the re-ask: partial), and has
# none before a mid-document edit nor after a restore from disk (misses); the control keeps any prefix (hits).
HYBRID_WORDS = {"first_load/cold": "full (cannot hit)", "resend/same prompt": "hit",
                "interleave/back to first": "hit", "reask/new question": "partial",
                "edit_middle/line at 50%": "miss", "restore_disk/resend": "miss", "restore_disk/reask": "miss",
                "restore_disk/extension": "hit"}
CONTROL_WORDS = {step: "full (cannot hit)" if step == "first_load/cold" else "hit" for step in HYBRID_WORDS}

Key = tuple[str, str, str, str]  # profile, variant, size label, "scenario/step" as the tables name the step


# -- the page, parsed -----------------------------------------------------------------------------------------

VOID = {"br", "meta", "img", "hr", "input", "link", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> Iterator[Node]:
        """This element and every one inside it, in document order."""
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def cells(self) -> list[Node]:
        return [c for c in self.children if isinstance(c, Node) and c.tag == "td"]

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {name: value or "" for name, value in attrs})
        self.open[-1].children.append(node)
        if tag not in VOID:
            self.open.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open[-1].children.append(Node(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        depth = max(i for i, node in enumerate(self.open) if node.tag == tag)  # a ValueError: closes nothing open
        del self.open[depth:]

    def handle_data(self, data: str) -> None:
        self.open[-1].children.append(data)


def parse_page(run_dir: Path) -> Node:
    tree = _Tree()
    tree.feed((run_dir / view.PAGE).read_text())
    tree.close()
    return tree.root


def page_verdicts(page: Node) -> dict[Key, str]:
    """Each step row's verdict cell, under the session heading above it ("tiny-qwen35 [VARIANT] at 2K"); its
    colour class must name the same word."""
    found: dict[Key, str] = {}
    heading: re.Match[str] | None = None
    for node in page.walk():
        if node.tag == "h2":
            heading = re.fullmatch(r"(\S+) \[(.*)\] at (\S+)", node.text())
        elif node.tag == "tr" and "data-step" in node.attrs:
            assert heading is not None
            cells = node.cells()
            (cell,) = [c for c in cells if c.attrs.get("class", "").startswith("verdict-")]
            word = cell.text()
            assert cell.attrs["class"] == f"verdict-{word.split()[0]}", (cell.attrs, word)
            key = (heading[1], heading[2], heading[3], cells[0].text())
            assert key not in found
            found[key] = word
    return found


# -- the text, parsed -----------------------------------------------------------------------------------------

def sections(text: str) -> dict[str, str]:
    """"## TITLE" -> what follows it, to the next such heading ("### " subheadings stay inside)."""
    parts = re.split(r"^## (?!#)(.*)$", text, flags=re.M)
    titles = parts[1::2]
    assert len(set(titles)) == len(titles)
    return {title: body.strip() for title, body in zip(titles, parts[2::2], strict=True)}


def variant_of(title: str) -> tuple[str, str]:
    """"tiny-qwen35 [mmproj=on,cache-reuse=256] (tiny:qwen35)" -> (profile, variant)."""
    found = re.fullmatch(r"(\S+) \[(.*)\] \((.*)\)", title)
    assert found, title
    return found[1], found[2]


def simple_table(lines: Sequence[str]) -> list[dict[str, str]]:
    """tabulate's "simple" table: a header, a rule of dashes whose runs are the columns, rows to a blank line. A
    step name longer than its column wraps onto a line of its own, every other cell empty."""
    starts = [m.start() for m in re.finditer(r"-+", lines[1])]

    def cut(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]

    names = cut(lines[0])
    rows: list[dict[str, str]] = []
    for line in lines[2:]:
        if not line.strip():
            break
        cells = cut(line)
        if rows and not any(cells[1:]):
            rows[-1][names[0]] += " " + cells[0]
        else:
            rows.append(dict(zip(names, cells, strict=True)))
    return rows


def github_table(lines: Sequence[str]) -> list[dict[str, str]]:
    """A "github" table: | header |, | --- |, then one | row | a line, to the first line that is not one."""
    def cut(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip()[1:-1].split("|")]

    names = cut(lines[0])
    assert set("".join(cut(lines[1]))) <= {"-", ":"}
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, cut(line), strict=True)))
    return rows


def narrow_verdicts(title: str, body: str) -> dict[Key, str]:
    """A variant's section as `reusebench report` prints it: one table per size under its label."""
    profile, variant = variant_of(title)
    lines = body.splitlines()
    found: dict[Key, str] = {}
    for i, line in enumerate(lines[:-2]):
        if re.fullmatch(r"\d+K?", line) and lines[i + 1].startswith("step ") and lines[i + 2].startswith("---"):
            for row in simple_table(lines[i + 1:]):
                key = (profile, variant, line, row["step"])
                assert key not in found
                found[key] = row["verdict"]
    return found


def wide_verdicts(title: str, body: str) -> dict[Key, str]:
    """A variant's section of report.md: one row per step, each size's columns side by side."""
    profile, variant = variant_of(title)
    rows = github_table(body.splitlines())
    labels = [name.removesuffix(" verdict") for name in rows[0] if name.endswith(" verdict")]
    return {(profile, variant, label, f"{row['scenario']}/{row['step']}"): row[f"{label} verdict"]
            for row in rows for label in labels if row[f"{label} verdict"]}


def miss_rate_counts(body: str) -> tuple[int, int, int, int]:
    """A variant's footer: (should-hit steps missed, of how many, partial, steps that cannot hit)."""
    found = re.search(r"^miss rate of turns that should hit: (\d+) of (\d+) re-processed everything \(\d+%\), "
                      r"(\d+) partial$", body, flags=re.M)
    cannot = re.search(r"^turns that cannot hit, counted apart: (\d+)\b", body, flags=re.M)
    assert found and cannot, body
    return int(found[1]), int(found[2]), int(found[3]), int(cannot[1])


# -- the runs -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bench:
    control: Path
    hybrid: Path
    workload: Path
    text: str  # `reusebench report --last 3`, as make bench ends
    report_json: list[dict[str, object]]  # `reusebench report --last 3 --json`


def _cli(*argv: str) -> str:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli.main(list(argv)) == 0
    return out.getvalue()


def _new_run(results: Path, *argv: str) -> Path:
    before = set((results / "runs").glob("*"))
    _cli(*argv, "--results", str(results))
    (found,) = set((results / "runs").glob("*")) - before
    return found


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Bench:
    results = tmp_path_factory.mktemp("bench")
    control = _new_run(results, "run", "--profile", "tiny-llama", "--size", str(CONTROL_SIZE), *SCENARIOS)
    hybrid = _new_run(results, "run", "--profile", "tiny-qwen35", "--variant", HYBRID_VARIANT,
                      *(arg for size in HYBRID_SIZES for arg in ("--size", str(size))), *SCENARIOS)
    workload = _new_run(results, "workload", WORKLOAD)
    last = ("report", "--results", str(results), "--last", "3")
    return Bench(control, hybrid, workload, _cli(*last), json.loads(_cli(*last, "--json")))


def measured(run_dir: Path) -> list[Record]:
    return [r for r in records.read_records(run_dir / "records.jsonl") if r.role == Role.MEASURE]


def by_rule(run_dir: Path) -> dict[Key, str]:
    """Each measured step's verdict by ``records.verdict``, checked to be the one its record keeps."""
    found = {}
    for r in measured(run_dir):
        assert r.verdict == records.verdict(r), r
        found[(r.profile, r.variant, size_label(r.size), f"{r.scenario}/{run_report.step_label(r)}")] = r.verdict
    return found


# -- scenario runs ---------------------------------------------------------------------------------------------

def test_every_step_has_one_verdict_on_the_page_in_the_texts_and_by_the_rule(bench: Bench) -> None:
    narrow = sections(bench.text)
    for run_dir, profile, variant, sizes, words in (
            (bench.control, "tiny-llama", "default", [CONTROL_SIZE], CONTROL_WORDS),
            (bench.hybrid, "tiny-qwen35", HYBRID_VARIANT, HYBRID_SIZES, HYBRID_WORDS)):
        rule = by_rule(run_dir)
        # 8 steps per size: the control's 8 at one size, the hybrid's 16 at two
        assert rule == {(profile, variant, size_label(size), step): word for size in sizes
                        for step, word in words.items()}
        (title,) = [t for t in narrow if t.startswith(f"{profile} [{variant}]")]
        assert page_verdicts(parse_page(run_dir)) == rule
        assert narrow_verdicts(title, narrow[title]) == rule
        report_md = sections((run_dir / "report.md").read_text())
        assert wide_verdicts(title, report_md[title]) == rule
    # report --json: one row per measured record of the three runs, in their order (by run id), its verdict the
    # record's
    runs = sorted((bench.control, bench.hybrid, bench.workload), key=lambda run_dir: run_dir.name)
    every = [r for run_dir in runs for r in measured(run_dir)]
    assert [row["verdict"] for row in bench.report_json] == [r.verdict for r in every]


def test_a_scenario_run_s_totals_are_its_page_s_words_counted(bench: Bench) -> None:
    narrow = sections(bench.text)
    for run_dir, variant, totals in (
            # the control: the first load cannot hit, the other 7 steps hit: 0 of 7 missed, 0 partial, 1 apart
            (bench.control, ("tiny-llama", "default"), (0, 7, 0, 1)),
            # the hybrid at each of 2 sizes: 3 misses (the edit, the resend and the re-ask after a restore), 1
            # partial (the re-ask) and 3 hits of 7 steps that should hit, and the first load: 6 of 14, 2, 2 apart
            (bench.hybrid, ("tiny-qwen35", HYBRID_VARIANT), (6, 14, 2, 2))):
        words = Counter(page_verdicts(parse_page(run_dir)).values())
        cannot = words["full (cannot hit)"]
        assert (words["miss"], words.total() - cannot, words["partial"], cannot) == totals
        (title,) = [t for t in narrow if t.startswith("tiny") and variant_of(t) == variant]
        assert miss_rate_counts(narrow[title]) == totals
        assert miss_rate_counts(sections((run_dir / "report.md").read_text())[title]) == totals


# -- the workload -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One request as the workload's page draws it: its bar on the timeline and its row in the user's table."""

    record: Record
    bar: str  # the bar's data-outcome (its colour)
    tooltip: str  # the word the bar's title ends with
    row: dict[str, str]  # the by-user table's cells


def page_requests(run_dir: Path, rs: list[Record]) -> list[Request]:
    """Every request of the page, matched to its record: the timeline draws the calls by start, the by-user
    tables list each user's in that order."""
    page = parse_page(run_dir)
    calls = sorted((r for r in rs if r.user is not None and r.endpoint and not r.error), key=lambda r: r.started_at)
    bars = [n for n in page.walk() if n.tag == "g" and n.has_class("request")]
    assert [(b.attrs["data-user"], b.attrs["data-slot"], b.attrs["data-role"]) for b in bars] == [
        (r.user, str(r.slot), r.role) for r in calls]
    header = ["step", "slot", "outcome", "path", "re-processed / ideal", "diverged at / resumed at", "miss cause",
              "the log says"]
    rows = [n for n in page.walk() if n.tag == "tr" and "data-user" in n.attrs]
    users = list(dict.fromkeys(r.user for r in calls))
    by_user = [r for user in users for r in calls if r.user == user]
    assert [(row.attrs["data-user"], row.cells()[0].text()) for row in rows] == [(r.user, r.step) for r in by_user]
    row_of = {id(r): dict(zip(header, [c.text() for c in row.cells()], strict=True))
              for r, row in zip(by_user, rows, strict=True)}
    found = []
    for r, bar in zip(calls, bars, strict=True):
        (title,) = [n for n in bar.children if isinstance(n, Node) and n.tag == "title"]
        tooltip = re.fullmatch(r".*\(([^()]*)\)", title.text())
        assert tooltip, title.text()
        found.append(Request(r, bar.attrs["data-outcome"], tooltip[1], row_of[id(r)]))
    return found


def test_every_turn_of_the_workload_has_one_word_on_the_page_and_by_the_rule(bench: Bench) -> None:
    rs = records.read_records(bench.workload / "records.jsonl")
    summary = next(r for r in rs if r.role == Role.SESSION)
    shared = summary.extra["system_prompt_tokens"]
    assert shared == 25  # the workload's 24 system prompt tokens and BOS
    turns = {id(t.record): t for t in service_report.turns(rs)}
    requests = page_requests(bench.workload, rs)
    verdicts: Counter[str] = Counter()
    for q in requests:
        r = q.record
        assert q.bar == q.tooltip == q.row["outcome"], q
        if r.role == Role.PROBE:
            assert q.bar == "probe"
            continue
        turn = turns[id(r)]
        assert turn.outcome == records.outcome(r, shared)
        assert q.bar == (turn.outcome if turn.should_hit else "cannot hit")
        assert q.row["path"] == turn.route and q.row["miss cause"] == (turn.cause or "")
        # the record's verdict, as `report --json` prints it, is the rule's with the same system prompt shared
        assert r.verdict == records.verdict(r, shared)
        assert r.verdict == (q.bar if turn.should_hit else "full (cannot hit)"), (r, q.bar)
        verdicts[r.verdict] += 1
    # 73 requests: 5 health checks, 68 turns: 42 that should hit (17 hits, 25 misses), 26 that cannot (9 first
    # turns, 8 after a head insert, 9 after the sleep) and reused no more than the system prompt
    assert Counter(q.bar for q in requests) == {"probe": 5, "hit": 17, "miss": 25, "cannot hit": 26}
    assert verdicts == {"hit": 17, "miss": 25, "full (cannot hit)": 26}


def test_the_workload_s_totals_on_its_page_and_in_the_text_are_its_words_counted(bench: Bench) -> None:
    rs = records.read_records(bench.workload / "records.jsonl")
    requests = [q for q in page_requests(bench.workload, rs) if q.bar != "probe"]
    should = [q for q in requests if q.bar != "cannot hit"]
    page = parse_page(bench.workload)
    cards = {}  # a card: <b>FIGURE</b><br>LABEL
    for card in (n for n in page.walk() if n.has_class("card")):
        (figure,) = [n for n in card.children if isinstance(n, Node) and n.tag == "b"]
        cards["".join(c for c in card.children if isinstance(c, str))] = figure.text()
    text = sections(bench.text)[f"workload run {bench.workload.name}"]
    # the page carries the text report rendered (no Markdown left): its miss table cell by cell; report.md is the text
    assert not [n for n in page.walk() if n.tag == "pre"] and "|---" not in page.text() and "###" not in page.text()
    (shown,) = [t for t in page.walk() if t.tag == "table" and "missed (re-processed everything)" in t.text()]
    assert [[c.text() for c in row.cells()] for row in shown.walk() if row.tag == "tr"][1:] == [
        list(row.values()) for row in github_table(text.split("### Miss rates by class\n\n", 1)[1].splitlines())]
    assert (bench.workload / "report.md").read_text().split("\n\n", 1)[1].strip() == text
    misses = sum(q.bar == "miss" for q in should)
    partial = sum(q.bar == "partial" for q in should)
    # 42 turns should hit: 25 re-processed everything, none partly, 17 hit
    assert (misses, partial, len(should)) == (25, 0, 42)
    assert cards["should-hit turns missed"] == f"{misses} of {len(should)}"
    assert cards["should-hit turns partial"] == f"{partial} of {len(should)}"
    assert cards["requests"] == "73" and cards["health checks"] == "5"  # 68 turns and 5 probes

    table = github_table(text.split("### Miss rates by class\n\n", 1)[1].splitlines())
    rows = {row["turns"]: row for row in table}

    def counted(label: str, group: list[Request]) -> None:
        row = rows[label]
        missed = re.fullmatch(r"(\d+) of (\d+) \(\d+%\)|0 of 0", row["missed (re-processed everything)"])
        assert missed, row
        assert (int(row["n"]), int(missed[1] or 0), int(row["partial"])) == (
            len(group), sum(q.bar == "miss" for q in group), sum(q.bar == "partial" for q in group)), label

    counted("should hit (conversation continues, regenerate)", should)
    for route in service_report.ROUTES:
        counted(route, [q for q in should if q.row["path"] == route])
    for kind in ("continues", "regenerate"):
        counted(kind, [q for q in should if q.row["step"] == kind])
    # a turn that cannot hit reads "cannot hit" on the page, whatever it re-processed: only how many compare
    assert int(rows["cannot hit"]["n"]) == len(requests) - len(should) == 26
    for kind, n in (("first", 9), ("head insert", 8), ("after sleep", 9)):  # 9 + 8 + 9 = 26
        assert int(rows[kind]["n"]) == sum(q.row["step"] == kind for q in requests) == n
    assert sum(int(rows[route]["n"]) for route in service_report.ROUTES) == 42

    causes = github_table(text.split("### Why should-hit turns missed (from the log)\n\n", 1)[1].splitlines())
    on_page = Counter(q.row["miss cause"] for q in should if q.row["miss cause"])
    assert {row["cause (from the log)"]: int(row["turns (of 42 that should hit)"]) for row in causes} == on_page
    assert on_page.total() == misses + partial  # every should-hit turn that did not hit has its cause
