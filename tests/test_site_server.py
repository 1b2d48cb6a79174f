"""`reusebench site --serve` takes hostile input: files of the site only, GET and HEAD only, a read timeout, a cap on
connections, loopback unless told otherwise. Each limit, tried."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from reusebench import cli
from reusebench.cli.exits import Exit
from reusebench.report import site_server

from conftest import SLOW_MACHINE_S


@contextmanager
def serving(site: Path, **limits: float) -> Iterator[site_server.SiteServer]:
    with site_server.SiteServer(site, ("127.0.0.1", 0), **limits) as server:  # type: ignore[arg-type]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "html").mkdir()
    (tmp_path / "html" / "index.html").write_text("<title>asv</title>")
    (tmp_path / "secret.txt").write_text("outside the site")
    return tmp_path / "html"


def connect(server: site_server.SiteServer) -> socket.socket:
    return socket.create_connection(server.server_address[:2], timeout=30)


def test_it_serves_the_site_read_only_and_nothing_outside_it(site: Path) -> None:
    with serving(site) as server:
        assert httpx.get(server.url + "index.html").text == "<title>asv</title>"
        assert httpx.head(server.url + "index.html").status_code == 200
        assert httpx.post(server.url + "index.html", content=b"x").status_code == 501  # GET and HEAD only
        assert httpx.put(server.url + "index.html", content=b"x").status_code == 501
        with connect(server) as raw:  # a path that climbs out is taken inside the site, where there is no such file
            raw.sendall(b"GET /../secret.txt HTTP/1.0\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.0 404")


def test_a_client_that_sends_nothing_is_cut_off_after_the_read_timeout(site: Path) -> None:
    with serving(site, read_timeout_s=0.5) as server, connect(server) as idle:
        started = time.monotonic()
        assert idle.recv(100) == b""  # closed by the server, not by this side's 30 s timeout
        assert time.monotonic() - started < 25


def test_connections_beyond_the_cap_get_503_and_the_next_after_one_ends_is_served(site: Path) -> None:
    with serving(site, max_connections=2) as server:
        held = [connect(server), connect(server)]  # two slow clients hold both slots (the timeout is 10 s)
        with connect(server) as third:
            assert third.recv(100).startswith(b"HTTP/1.1 503 Service Unavailable")
        for raw in held:
            raw.close()
        deadline = time.monotonic() + SLOW_MACHINE_S  # a limit for a hang: the loop ends as the slots come back
        while (status := httpx.get(server.url).status_code) == 503 and time.monotonic() < deadline:
            time.sleep(0.05)  # the held connections' threads see their close and give the slots back
        assert status == 200


def test_forty_clients_connecting_at_once_all_get_through_the_backlog_before_any_is_accepted(site: Path) -> None:
    # nothing accepts (the server is not serving): every connection waits in the listen backlog, 128 deep; with the
    # standard library's 5, the kernel would drop the 7th client's SYN and its connect would wait for a retry
    with site_server.SiteServer(site, ("127.0.0.1", 0)) as server:
        host, port = server.server_address[:2]
        clients: list[socket.socket] = []
        try:
            while len(clients) < 40:
                clients.append(socket.create_connection((host, port), timeout=5))
        except TimeoutError:
            pass
        finally:
            for raw in clients:
                raw.close()
    assert len(clients) == 40


def test_only_a_loopback_address_is_served_without_a_warning() -> None:
    assert site_server.exposure_warning("127.0.0.1") is None and site_server.exposure_warning("localhost") is None
    assert site_server.exposure_warning("0.0.0.0") == (
        "warning: listening on 0.0.0.0: anyone who reaches this address reads the site (the figures, commit hashes, "
        "machine names); there is no login")


def test_site_without_a_published_nightly_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["site", "--results", str(tmp_path)]) == Exit.USAGE
    assert capsys.readouterr().err.strip() == (
        f"reusebench site: no asv config at {tmp_path / 'asv.llama.conf.json'}: run `reusebench nightly` first, or "
        "pass --config asv.conf.json (make bench's site)")
