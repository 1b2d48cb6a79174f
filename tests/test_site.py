"""The published asv site in a real browser: Debian's chromium, driven by selenium through chromedriver.

`make test` installs both (the Makefile's `chromium` target) and the site's libraries
(`site-assets`). The site is the one of the two-commit nightly flow (tests/test_asv_flow.py:
the second commit disables context checkpoints, a planted regression), published for two
machine names, as when two GPU boxes push their results to one results repository, and
made self-contained (reusebench.report.site). The browser resolves no host but 127.0.0.1, so a
library still taken from a CDN breaks the page. Screenshots go to results/site-test/.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from reusebench import nightly
from reusebench.report import site, site_server
from test_asv_flow import MACHINE, REASK, REPO, VARIANT, asv_env, disable_checkpoints, fake_llama_cpp, run_asv

SECOND_MACHINE = "gpu-box-2"
SCREENSHOTS = REPO / "results" / "site-test"
GRAPH = "reuse.ReprocessedTokens.track_reprocessed_tokens"
WAIT_S = 20


def copy_machine_results(results_dir: Path, source: str, target: str) -> None:
    """The results of machine `source` as if another box had run them and pushed them as `target`."""
    for path in (results_dir / source).glob("*.json"):
        data = json.loads(path.read_text())
        if path.name == "machine.json":
            data["machine"] = target
        else:
            data["params"]["machine"] = target
        (results_dir / target).mkdir(exist_ok=True)
        (results_dir / target / path.name).write_text(json.dumps(data))


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-commit flow's results of two machines, published and made self-contained: the site directory."""
    tmp_path = tmp_path_factory.mktemp("site")
    first = fake_llama_cpp(tmp_path / "llama.cpp")
    config = str(nightly.derive(REPO / nightly.CONFIG_FILE, tmp_path, tmp_path / "llama.cpp").path)
    env = asv_env(tmp_path, PYTHONPATH=str(REPO), REUSEBENCH_ASV_SCENARIOS="resend reask")
    run_asv(env, "machine", "--yes", "--machine", MACHINE, "--config", config)
    # The reuse benchmarks only (the option check would add a session per commit), so asv itself, not the nightly.
    run_asv(env, "run", "--machine", MACHINE, "--config", config, f"{first}^!", "--bench", "^reuse", timeout=300)
    disable_checkpoints(tmp_path / "llama.cpp")
    run_asv(env, "run", "--machine", MACHINE, "--config", config, "NEW", "--bench", "^reuse", timeout=300)
    copy_machine_results(tmp_path / "asv", MACHINE, SECOND_MACHINE)
    run_asv(env, "publish", "--config", config)
    site.make_self_contained(tmp_path / "html")
    return tmp_path / "html"


def serve(directory: Path) -> Iterator[str]:
    """`directory` through `reusebench site --serve`'s server on 127.0.0.1 (a free port) while the generator is
    open: its base URL."""
    with site_server.SiteServer(directory, ("127.0.0.1", 0)) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.url
        finally:
            server.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "chromium and chromedriver are missing: `make chromium` installs them"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                     # No host but loopback: a library still loaded from a CDN fails as it would offline.
                     "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(argument)
    with webdriver.Chrome(options=options, service=Service(executable_path=driver)) as chrome:
        yield chrome


def wait(browser: webdriver.Chrome, what: str, condition) -> None:
    try:
        WebDriverWait(browser, WAIT_S).until(lambda _: condition())
    except Exception as error:  # selenium's TimeoutException says nothing about what was awaited
        shot = screenshot(browser, "failed")
        raise AssertionError(f"{what}: not seen in {WAIT_S} s at {browser.current_url} (screenshot: {shot})") from error


def screenshot(browser: webdriver.Chrome, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    browser.save_screenshot(str(path))
    return path


def open_page(browser: webdriver.Chrome, url: str) -> None:
    browser.get(url)
    assert not browser.current_url.endswith("error.html"), "a JavaScript library failed to load (asv's error page)"


def body_text(browser: webdriver.Chrome) -> str:
    return browser.find_element(By.TAG_NAME, "body").text


def series(browser: webdriver.Chrome) -> list[tuple[str, list[float]]]:
    """The graph flot drew: (label, y of each point) per series."""
    drawn = browser.execute_script(
        "var plot = $('#main-graph').data('plot');"
        "return plot ? plot.getData().map(function (s) {"
        "  return [s.label, s.data.map(function (p) { return p[1]; })]; }) : null;")
    return [(label, ys) for label, ys in drawn or []]


def selector(browser: webdriver.Chrome, panel: str, value: str):
    """The button of `value` in the graph page's `panel` (machine, size, variant, step)."""
    return browser.find_element(By.XPATH, f"//div[contains(@class, 'panel')][.//*[normalize-space()='{panel}']]"
                                          f"//a[contains(@class, 'btn')][normalize-space()='{value}']")


def check_index(browser: webdriver.Chrome, base: str) -> None:
    """The benchmark list: our benchmarks by name, with their latest figure in their unit, for both machines."""
    open_page(browser, f"{base}index.html#summarylist")
    wait(browser, "the benchmark list", lambda: GRAPH in body_text(browser))
    rows = body_text(browser).splitlines()

    def row(name: str) -> str:
        found = [line for line in rows if line.startswith(f"{name} (")]
        assert found, f"{name} is not in the benchmark list"
        return found[0]

    assert "tokens" in row(GRAPH) and REASK in row(GRAPH)
    assert row("reuse.FirstLoad.track_prefill_seconds").split(")", 1)[1].split()[0].endswith("s")  # e.g. 2.354s
    assert MACHINE in rows and SECOND_MACHINE in rows  # the machine selector
    screenshot(browser, "list")
    open_page(browser, f"{base}index.html")
    wait(browser, "the benchmark grid", lambda: "ReprocessedTokens.track_reprocessed_tokens" in body_text(browser))
    screenshot(browser, "grid")


def check_graph(browser: webdriver.Chrome, base: str) -> None:
    """One point per commit and series per machine and step; the selectors take series away; the re-ask is 515
    tokens, then the whole prompt (the planted regression)."""
    open_page(browser, f"{base}index.html#{GRAPH}")
    wait(browser, "the graph", lambda: series(browser))
    drawn = series(browser)
    assert len(drawn) == 4, f"not one series per machine and step: {drawn}"  # two machines x resend, reask
    assert all(len(points) == 2 for _, points in drawn), f"not one point per commit: {drawn}"
    for panel, value in (("size", "2K"), ("variant", VARIANT), ("step", REASK), ("machine", SECOND_MACHINE)):
        assert "active" in selector(browser, panel, value).get_attribute("class"), f"{panel} {value} not selected"
    selector(browser, "step", "resend/same prompt").click()
    wait(browser, "the re-ask alone", lambda: len(series(browser)) == 2)
    selector(browser, "machine", SECOND_MACHINE).click()
    wait(browser, "one machine", lambda: len(series(browser)) == 1)
    ((label, points),) = series(browser)
    assert REASK in label, label
    assert len(points) == 2 and points[0] <= 600 and points[1] >= 2048, points  # checkpoints on, then off
    assert "p-step=" in browser.current_url and f"machine={MACHINE}" in browser.current_url  # a link to this view
    screenshot(browser, "graph")


def check_regressions(browser: webdriver.Chrome, base: str) -> None:
    """The regressions page lists the re-ask that lost its checkpoint."""
    open_page(browser, f"{base}index.html#regressions")
    planted = f"{GRAPH}('2K', '{VARIANT}', '{REASK}')"
    wait(browser, "the planted regression", lambda: planted in body_text(browser))
    line = next(line for line in body_text(browser).splitlines() if line.startswith(planted))
    assert "515 tokens" in line, line
    screenshot(browser, "regressions")


@pytest.fixture(scope="module")
def base_url(published: Path) -> Iterator[str]:
    yield from serve(published)


@pytest.mark.e2e
def test_the_published_site_in_a_browser(browser: webdriver.Chrome, base_url: str) -> None:
    check_index(browser, base_url)
    check_graph(browser, base_url)
    check_regressions(browser, base_url)


def drop_last_commit(site_dir: Path) -> None:
    for graph in (site_dir / "graphs").rglob(f"{GRAPH}.json"):
        graph.write_text(json.dumps(json.loads(graph.read_text())[:-1]))


def drop_jquery(site_dir: Path) -> None:
    (site_dir / next(asset.local for asset in site.ASSETS if asset.package == site.JQUERY)).unlink()


@pytest.mark.e2e
@pytest.mark.parametrize("damage, check", [(drop_last_commit, check_graph), (drop_jquery, check_index)])
def test_the_browser_checks_notice_a_broken_site(browser: webdriver.Chrome, published: Path, tmp_path: Path,
                                                 damage, check) -> None:
    broken = tmp_path / "html"
    shutil.copytree(published, broken)
    damage(broken)
    for base in serve(broken):
        with pytest.raises(AssertionError):
            check(browser, base)
