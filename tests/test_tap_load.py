"""The tap under load on loopback: 16 clients and 2,000 requests through `reusebench tap` to a real llama-server,
every one relayed and recorded. Bounded in count (the requests) and in time (the test's timeout); the figures it
prints are tools/tap_load.py's, whose latency and memory the README quotes from a run of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_tool

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(900)
def test_16_clients_and_2000_requests_lose_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    load = load_tool("tap_load").run(clients=16, requests=2000, tmp=tmp_path)
    with capsys.disabled():
        print("\n" + "\n".join(load.lines()))
    # every request answered through the tap, one record each, and the summary counted them all
    assert load.relayed == load.recorded == load.summary_requests == 2000 and load.lost == 0
    assert load.peak_rss_mib > 0
