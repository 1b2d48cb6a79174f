"""A run's page in a real browser (Debian's chromium through selenium, as tests/test_site.py): written by
`reusebench run` from the records of a real tiny run, opened from file:// with no host resolvable, its bars
on a log axis read back from the drawn elements. The planted-marker check of every written page is in
tests/test_privacy.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from reusebench import cli, records
from reusebench.records import Role
from reusebench.report import service_report, view

from test_site import browser, screenshot  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("view")
    assert cli.main(["run", "--profile", "tiny-qwen35", "--variant", "mmproj=off,cache-reuse=0", "--size", "2K",
                     "--scenario", "resend", "--scenario", "edit_middle", "--results", str(results)]) == 0
    (found,) = (results / "runs").iterdir()
    return found


def test_run_writes_the_page_and_the_list_of_pages(run_dir: Path):
    index = (run_dir.parent.parent / view.PAGE).read_text()
    assert f'href="runs/{run_dir.name}/{view.PAGE}"' in index
    page = (run_dir / view.PAGE).read_text()
    assert "http:" not in page and "https:" not in page and "<script" not in page  # nothing to fetch, nothing to run


def test_the_page_shows_each_step_as_bars_on_a_log_axis(run_dir: Path, browser):  # noqa: F811
    measured = [r for r in records.read_records(run_dir / "records.jsonl") if r.role == Role.MEASURE]
    browser.get((run_dir / view.PAGE).as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "table.steps tr[data-step]")
    assert [row.get_attribute("data-step") for row in rows] == [f"{r.scenario}/{r.step}" for r in measured]
    drawn = {}
    for row, r in zip(rows, measured):
        bars = {bar.get_attribute("data-kind"): bar for bar in row.find_elements(By.CSS_SELECTOR, "rect.bar")}
        assert {kind: int(bar.get_attribute("data-tokens")) for kind, bar in bars.items()} == {
            "re-processed": r.prompt_n, "ideal": r.ideal, "expected": r.expected}
        drawn[r.step] = (r.prompt_n, bars["re-processed"].size["width"])
    # The resend re-processes 4 tokens, the edit all 2,066 of its prompt (a hybrid: no checkpoint before 50%):
    # on the log axis from 1 to the longest prompt, widths go as log10(10 * tokens).
    (resend_tokens, resend_width), (edit_tokens, edit_width) = drawn["same prompt"], drawn["line at 50%"]
    assert (resend_tokens, edit_tokens) == (4, measured[-1].prompt_tokens)
    assert resend_width / edit_width == pytest.approx(math.log10(40) / math.log10(10 * edit_tokens), abs=0.02)
    assert resend_width > 0.25 * edit_width  # both read: 4 tokens is no invisible sliver beside 2,066
    # Where each prompt left what the slot held: the resend nowhere (the slot holds it and its answer), the
    # edit at the inserted line, near the middle; the server resumed at its checkpoint 4 before the end, at 0.
    resend, edit = measured[1], measured[2]
    cells = {row.get_attribute("data-step"): row.find_elements(By.TAG_NAME, "td")[3].text for row in rows}
    assert cells["resend/same prompt"] == f"{resend.prompt_tokens:,} / {resend.prompt_tokens - 4:,}"
    assert 0.4 < edit.extra["diverges_at"] / edit.prompt_tokens < 0.6
    assert cells["edit_middle/line at 50%"] == f"{edit.extra['diverges_at']:,} / 0"
    # Nothing but the file itself was loaded.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    screenshot(browser, "run-page")


@pytest.fixture(scope="module")
def workload_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("workload-view")
    assert cli.main(["workload", "service-small", "--results", str(results)]) == 0
    (found,) = (results / "runs").iterdir()
    return found


def test_a_workload_page_draws_every_request_in_its_slots_lane(workload_dir: Path, browser):  # noqa: F811
    kept = records.read_records(workload_dir / "records.jsonl")
    calls = [r for r in kept if r.user is not None and r.endpoint and not r.error]
    browser.get((workload_dir / view.PAGE).as_uri())
    drawn = browser.find_elements(By.CSS_SELECTOR, "svg.timeline g.request")
    assert len(drawn) == len(calls)
    lanes = [lane.text for lane in browser.find_elements(By.CSS_SELECTOR, "svg.timeline text.slot")]
    assert lanes == [f"slot {slot}" for slot in sorted({r.slot for r in calls})]
    # The health check takes a conversation's slot (report B): a probe drawn in a lane a chat user's turn uses.
    health = service_report.health_effect(kept, 1024)
    probe_slots = {g.get_attribute("data-slot") for g in drawn if g.get_attribute("data-role") == Role.PROBE}
    chat_slots = {g.get_attribute("data-slot") for g in drawn if g.get_attribute("data-user").startswith("chat")}
    assert health.took_slot > 0 and probe_slots & chat_slots
    # A prefill's full-height part is its prompt time on the run's time axis.
    longest = max(calls, key=lambda r: r.prompt_ms or 0)
    (bar,) = [g for g in drawn if g.get_attribute("data-prefill-ms") == f"{longest.prompt_ms:.1f}"][:1]
    seconds = float(browser.find_element(By.CSS_SELECTOR, "svg.timeline").get_attribute("data-seconds"))
    plot = view.TIMELINE_WIDTH - view.LABEL_WIDTH
    width = bar.find_element(By.CSS_SELECTOR, "rect.prefill").size["width"]
    assert width == pytest.approx(plot * longest.prompt_ms / 1000 / seconds, abs=1.5)
    # Each user's requests open on demand, one row per request, in the order sent.
    (long_user,) = [d for d in browser.find_elements(By.TAG_NAME, "details") if d.text.startswith("long-1:")]
    long_user.find_element(By.TAG_NAME, "summary").click()
    rows = long_user.find_elements(By.CSS_SELECTOR, "tr[data-user='long-1']")
    assert [row.find_element(By.TAG_NAME, "td").text for row in rows] == [
        r.step for r in calls if r.user == "long-1"]
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    screenshot(browser, "workload-page")


def test_the_machine_state_beside_a_timing_names_the_load_and_the_gpu():
    measured = records.Record(run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=32768,
                              scenario="first_load", step="cold", role=Role.MEASURE, endpoint="/completion",
                              started_at=0.0, ended_at=1.0, host={"load_avg_1m": 1.9, "cpu_count": 16},
                              gpu={"start_temperature_c": 41, "sm_clock_mean_mhz": 1980.4, "throttled_fraction": 0.25})
    assert view.machine_state(measured) == ("load 1.90 on 16 cores, GPU from 41 °C, SM 1,980 MHz, throttled 25% of "
                                            "readings")
    measured.host, measured.gpu = None, {"start_temperature_c": None}  # no GPU, no host state: nothing to say
    assert view.machine_state(measured) == "-"
