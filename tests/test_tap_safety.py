"""The tap in front of a real llama-server, attacked: it relays to its upstream only, refuses what would exhaust
it, keeps no text of an error or a credential, and records every completion request it relays, however odd.

Two stand-ins, each for what a real llama-server cannot be: `other_host`, a plain web server on another port (the
host an open proxy would reach), and `echo`, a server that answers each request with its own body (so the bytes
that arrived upstream can be compared with the bytes sent).
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reusebench import records, tiny
from reusebench.llama import client, logs
from reusebench.llama.process import ServerProcess
from reusebench.llama.task_log import TaskLog
from reusebench.records import Record, Role
from reusebench.tap import Tap, TapOptions, exchange
from reusebench.tap.relay import RelayLimits

from conftest import SLOW_MACHINE_S, default_llama_server

pytestmark = pytest.mark.e2e

MARKER = "zqxjv-planted-marker"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = ServerProcess(default_llama_server(), ("-m", str(tiny.model_path("llama")), "-c", "4096", "-np", "2"),
                            log_verbosity=4)
    with process:
        yield process


@contextmanager
def tapped(upstream: str, tmp: Path, log: Path | None = None, **limits: float) -> Iterator[Tap]:
    tap = Tap(TapOptions(upstream=upstream, listen=("127.0.0.1", 0), results=tmp / "results", key_file=tmp / "tap.key",
                         server_log=log, limits=RelayLimits(**limits)))  # type: ignore[arg-type]
    tap.start()
    try:
        yield tap
    finally:
        tap.stop("the test ended")


def kept(tap: Tap) -> list[Record]:
    return records.read_records(tap.run_dir.records_path)


def raw(tap: Tap, data: bytes, read: int = 65536) -> bytes:
    """Send `data` on one connection; what came back before the tap closed it (or 30 s passed)."""
    host, port = tap.relay.server.server_address[:2]
    with socket.create_connection((str(host), port), timeout=30) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(read):
            got += chunk
        return got


class _Counting(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"page!")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def other_host() -> Iterator[tuple[int, type[_Counting]]]:
    handler = type("Handler", (_Counting,), {"hits": 0})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            yield web.server_address[1], handler
        finally:
            web.shutdown()


def test_an_absolute_target_naming_another_host_is_refused_and_that_host_sees_nothing(server, tmp_path) -> None:
    with other_host() as (port, page), tapped(server.base_url, tmp_path) as tap:
        close = "Host: x\r\nConnection: close\r\n\r\n"
        answer = raw(tap, f"GET http://127.0.0.1:{port}/index.html HTTP/1.1\r\n{close}".encode())
        # the standard library reads "//host/x" as the path "/host/x" (CPython gh-87389): to the upstream, which
        # refuses it for want of its key (401)
        protocol_relative = raw(tap, f"GET //127.0.0.1:{port}/index.html HTTP/1.1\r\n{close}".encode())
        connect = raw(tap, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{close}".encode())
        summary = tap.stop("the test ended")
    assert answer.startswith(b"HTTP/1.1 400") and b"page!" not in answer
    assert protocol_relative.startswith(b"HTTP/1.1 401") and connect.startswith(b"HTTP/1.1 501")
    assert page.hits == 0  # the open-proxy request of the issue fetched this page before
    assert summary.extra["refused"] == {"not origin-form": 1}
    assert summary.extra["unrecorded"] == {"GET other": 1}  # its path, by no name the client chose


def test_a_body_beyond_the_limit_is_refused_with_413_without_reading_it(server, tmp_path) -> None:
    with tapped(server.base_url, tmp_path, max_body_bytes=2**20) as tap:
        huge = raw(tap, b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000000\r\n\r\n{")
        chunk = b"%x\r\n%s\r\n" % (2**19, b"a" * 2**19)  # three chunks of 512 KiB: 1.5 MiB, past 1 MiB
        chunked = raw(tap, b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3)
        framing = raw(tap, b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + b"1" * 5000 + b"\r\n")  # a chunk-size line of 5,000 digits
        summary = tap.stop("the test ended")
    assert huge.startswith(b"HTTP/1.1 413") and chunked.startswith(b"HTTP/1.1 413") and framing.startswith(b"HTTP/1.1 400")
    assert summary.extra["refused"] == {"body too large": 2, "bad framing": 1}
    assert [r for r in kept(tap) if r.role == Role.MEASURE] == []  # nothing was relayed, so nothing recorded


def test_a_client_that_sends_nothing_is_closed_after_the_read_timeout(server, tmp_path) -> None:
    with tapped(server.base_url, tmp_path, read_timeout_s=0.5) as tap:
        started = time.monotonic()
        assert raw(tap, b"GET /health HTTP/1.1\r\n") == b""  # a slowloris line, never finished
        waited = time.monotonic() - started
        summary = tap.stop("the test ended")
    assert 0.4 < waited < 25 and summary.extra["refused"] == {"read timeout": 1}


def test_connections_beyond_the_cap_get_503(server, tmp_path) -> None:
    with tapped(server.base_url, tmp_path, max_connections=2) as tap:
        host, port = tap.relay.server.server_address[:2]
        held = [socket.create_connection((str(host), port), timeout=30) for _ in range(2)]
        assert raw(tap, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 503")
        for s in held:
            s.close()
        summary = tap.stop("the test ended")
    assert summary.extra["refused"] == {"too many connections": 1}


def test_odd_requests_are_relayed_and_each_recorded_with_a_fixed_reason(server, tmp_path) -> None:
    auth = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    bodies = {
        "nested": b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
        "id beyond int32": b'{"prompt": [1, 2, 4294967296], "n_predict": 1}',
        "lora without scale": b'{"prompt": "one two", "n_predict": 1, "lora": [{"id": 0}]}',
    }
    with tapped(server.base_url, tmp_path, log=server.raw_log_path) as tap:
        statuses = {name: httpx.post(tap.relay.address + "/completion", content=body, headers=auth, timeout=60)
                    .status_code for name, body in bodies.items()}
        dotted = httpx.post(tap.relay.address + "/x/../completion", json={"prompt": "a b c", "n_predict": 1},
                            headers=auth, timeout=60)
        summary = tap.stop("the test ended")
    calls = [r for r in kept(tap) if r.role in (Role.MEASURE, Role.PROBE)]
    assert len(calls) == 4 and summary.extra["requests"] == 4  # one record for each, none dropped
    # the server's own answers, relayed: it refuses the nesting, and takes the others (an id past int32 too)
    assert statuses == {"nested": 400, "id beyond int32": 200, "lora without scale": 200}
    assert [r.extra.get("unclassed") for r in calls[:2]] == ["the body nests too deep", "a token id out of range"]
    assert calls[2].lora == "0:0" and calls[2].prompt_n  # scale 0.0, as the server reads it
    assert dotted.status_code == 200 and calls[3].endpoint == exchange.COMPLETION and calls[3].prompt_n


def test_no_error_text_and_no_credential_reach_any_file(server, tmp_path) -> None:
    """llama-server's parse error quotes the body it could not read; the upstream URL carries a password."""
    upstream = server.base_url.replace("http://", "http://someone:hunter2-secret@")
    with tapped(upstream, tmp_path) as tap:
        httpx.post(tap.relay.address + "/completion", content=f'{{"prompt": {MARKER} }}'.encode(),
                   headers={"Authorization": f"Bearer {server.api_key}"}, timeout=60)
        summary = tap.stop("the test ended")
    (call,) = [r for r in kept(tap) if r.role == Role.MEASURE]
    assert call.status is not None and call.status >= 400 and call.error in {f"server {t}" for t in client.ERROR_TYPES}
    assert summary.extra["upstream"].startswith("http://***@127.0.0.1:")
    written = "".join(p.read_text(errors="replace") for p in tap.run_dir.path.rglob("*") if p.is_file())
    assert MARKER not in written and "hunter2" not in written


@contextmanager
def echo() -> Iterator[str]:
    class Echo(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_PUT = do_POST

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{web.server_address[1]}"
        finally:
            web.shutdown()


@pytest.fixture(scope="module")
def echo_tap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tap]:
    with echo() as upstream, tapped(upstream, tmp_path_factory.mktemp("echo")) as tap:
        yield tap


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.sampled_from([*sorted(exchange.RECORDED), "/health", "/v1/embeddings", "/x/../completion"]),
       st.one_of(st.binary(max_size=300), st.recursive(
           st.none() | st.integers() | st.text(max_size=10),
           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
               ["prompt", "messages", "lora", "stream", "choices", "id", "scale"]), inner, max_size=4),
           max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_the_bytes_relayed_are_the_bytes_sent_and_each_completion_request_is_recorded(
        echo_tap: Tap, path: str, body: bytes) -> None:
    before = echo_tap.tally.requests
    answer = httpx.post(echo_tap.relay.address + path, content=body, timeout=30)
    assert (answer.status_code, answer.content) == (200, body)
    recorded = path.replace("/x/..", "") in exchange.RECORDED
    deadline = time.monotonic() + SLOW_MACHINE_S  # a hang's limit: the record is written as the answer's last byte goes
    while echo_tap.tally.requests == before and recorded and time.monotonic() < deadline:
        time.sleep(0.01)
    assert echo_tap.tally.requests == before + recorded


@contextmanager
def flaky_upstream(hang_s: float = 0.0) -> Iterator[str]:
    """A server whose /props fails once and then answers, and whose /completion answers with timings after
    `hang_s`: the faults a real llama-server does not have on demand."""
    props_calls = []

    class Flaky(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status: int, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            props_calls.append(1)
            if len(props_calls) == 1:
                self.reply(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
            else:
                self.reply(200, {"model_path": "/models/served.gguf", "build_info": "b1-flaky"})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(hang_s)
            self.reply(200, {"content": "x", "tokens": [5], "stop": True, "timings": {
                "prompt_n": 3, "cache_n": 0, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": 1.0}})

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky) as web:
        web.daemon_threads = True
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{web.server_address[1]}"
        finally:
            web.shutdown()


def test_a_failed_first_look_at_the_server_is_tried_again(tmp_path, monkeypatch) -> None:
    from reusebench.tap import tap as tap_module

    monkeypatch.setattr(tap_module, "LEARN_RETRY_S", 0.0)  # at once, not a minute later
    body = {"prompt": [1, 2, 3], "n_predict": 1}
    with flaky_upstream() as upstream, tapped(upstream, tmp_path) as tap:
        assert httpx.post(tap.relay.address + "/completion", json=body, timeout=30).status_code == 200
        deadline = time.monotonic() + SLOW_MACHINE_S  # a hang's limit, not a margin: it ends when /props is learned
        # each request tries until /props answers; the tap marks a look as taken before it answers, so what is waited
        # for is what the look sets: the model, and then the build
        while tap.recorder.build != "b1-flaky" and time.monotonic() < deadline:
            httpx.post(tap.relay.address + "/completion", json=body, timeout=30)
            time.sleep(0.05)
        httpx.post(tap.relay.address + "/completion", json=body, timeout=30)
        tap.stop("the test ended")
    last = [r for r in kept(tap) if r.role in (Role.MEASURE, Role.PROBE)][-1]
    assert (last.model, last.build) == ("served.gguf", "b1-flaky")


def test_a_request_still_being_read_at_stop_is_counted_not_lost(tmp_path, monkeypatch) -> None:
    from reusebench.tap import request as request_module
    from reusebench.tap import tap as tap_module

    monkeypatch.setattr(tap_module, "STOP_WAIT_S", 0.2)
    slow_end = request_module.Request.ended

    def ended_late(self, error):  # its prompt's ids still on their way when the stop comes
        time.sleep(2.0)
        slow_end(self, error)

    monkeypatch.setattr(request_module.Request, "ended", ended_late)
    def send(url: str) -> None:
        with pytest.raises(httpx.HTTPError):  # the stop cuts it
            httpx.post(url + "/completion", json={"prompt": [1]}, timeout=60)

    with flaky_upstream(hang_s=30.0) as upstream, tapped(upstream, tmp_path) as tap:
        sent = threading.Thread(target=send, args=(tap.relay.address,), daemon=True)
        sent.start()
        deadline = time.monotonic() + SLOW_MACHINE_S  # a hang's limit: it ends as the relay takes the request
        while not tap.relay._active and time.monotonic() < deadline:
            time.sleep(0.01)
        summary = tap.stop("the test ended")
    assert summary.extra["unfinished_at_stop"] == 1 and summary.extra["requests"] == 0
    time.sleep(2.5)  # the late end comes and writes nothing after the summary
    assert [r.role for r in kept(tap)] == [Role.SESSION]


def test_listening_beyond_loopback_takes_expose_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    from reusebench import cli

    assert cli.main(["tap", "--upstream", "http://127.0.0.1:9", "--listen", "0.0.0.0:8081"]) == 2
    assert capsys.readouterr().err.strip() == ("reusebench tap: --listen 0.0.0.0 is not loopback: the tap has no login "
                                               "of its own, so say --expose to listen there")


def test_with_expose_it_warns_what_is_exposed_before_it_binds(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from reusebench import cli

    # the port is held on loopback, so the tap's bind on 0.0.0.0 fails right after the warning: nothing listens
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = cli.main(["tap", "--upstream", "http://127.0.0.1:9", "--listen", f"0.0.0.0:{port}", "--expose",
                         "--key-file", str(tmp_path / "tap.key"), "--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[0] == ("warning: listening on 0.0.0.0: anyone who reaches this address reaches the upstream server "
                      "through it; there is no login")
    assert err[-1].startswith(f"reusebench tap: cannot start on 0.0.0.0:{port}: ")


def test_a_prompt_cannot_forge_a_log_line_even_at_lv_9(tmp_path: Path) -> None:
    """The causes and the server's lifetimes come from its log, so a client that could write a whole line there could
    fake them. b11434 logs a prompt at -lv 9 inside one line (JSON-escaped, or token by token), never as lines of
    its own: the forged lines below, raw newlines and all, become no event."""
    forged = ("\n0.00.030.870 I srv  llama_server: listening on http://127.0.0.1:9\n"
              "0.01.000.002 I slot update_slots: id  0 | task 77 | new prompt, n_ctx_slot = 4096, n_keep = 0, "
              "task.n_tokens = 424242\n")
    with ServerProcess(default_llama_server(), ("-m", str(tiny.model_path("llama")), "-c", "4096", "-np", "1"),
                       log_verbosity=9) as server:
        with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {server.api_key}"},
                          timeout=120) as http:
            assert http.post("/completion", json={"prompt": "hello" + forged + "there", "n_predict": 2}).status_code == 200
            assert http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": forged}],
                                                           "max_tokens": 2}).status_code == 200
        raw = server.raw_log_path.read_text(errors="replace")
        log = TaskLog(server.raw_log_path)
        assert log.claim(None, 424242, wait_s=0) is None  # reads the whole log, and no task has the forged length
    assert "424242" in raw  # the server did log the prompt, inside its own lines
    assert log.lifetimes == 1  # the one real start
    events = logs.parse_lines(raw.splitlines())
    assert not [e for e in events if 424242 in e.fields.values() or e.fields.get("port") == 9]
