"""The client's streams against a local stand-in of /completion: a progress callback can end one."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from reusebench.llama.client import LlamaClient, StreamEnded

EVENTS = [{"prompt_progress": {"processed": n, "cache": 100, "total": 1100}} for n in (612, 1100)]
FINAL = {"content": "", "tokens": [7], "stop": True, "id_slot": 0, "tokens_evaluated": 1100,
         "timings": {"prompt_n": 1000, "cache_n": 100, "prompt_ms": 50.0, "predicted_n": 1, "predicted_ms": 2.0}}


class _Streams(http.server.BaseHTTPRequestHandler):
    sent: list[int] = []  # events written per request, before the client went away or the stream ended

    def do_POST(self) -> None:  # noqa: N802 (the handler's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        written = 0
        try:
            for event in [*EVENTS, FINAL]:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                written += 1
        except OSError:
            pass
        _Streams.sent.append(written)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Streams)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_progress_callback_that_returns_nothing_leaves_the_stream_alone(server: str) -> None:
    seen: list[tuple[int, int, int]] = []
    with LlamaClient(server) as client:
        done = client.complete([1, 2, 3], n_predict=1, on_progress=lambda *numbers: seen.append(numbers))
    assert seen == [(612, 100, 1100), (1100, 100, 1100)]
    assert (done.prompt_n, done.cache_n, done.tokens) == (1000, 100, [7])


def test_a_progress_callback_ends_the_stream_once_the_count_is_known(server: str) -> None:
    """The first event says what the server will re-process: total 1,100 - cached 100 = 1,000 tokens."""
    with LlamaClient(server) as client, pytest.raises(StreamEnded) as ended:
        client.complete([1, 2, 3], n_predict=1, on_progress=lambda processed, cached, total: True)
    assert (ended.value.processed, ended.value.cached, ended.value.total) == (612, 100, 1100)
    assert ended.value.total - ended.value.cached == 1000
