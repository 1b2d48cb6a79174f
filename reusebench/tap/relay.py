"""The tap's HTTP plumbing: a pass-through relay from clients to one llama-server, bytes unchanged.

The server side is the standard library's ``ThreadingHTTPServer``, a thread per connection, and the upstream side
httpx, which the suite already uses. A relay on loopback in front of a server with a few slots meets at most tens
of connections at once, and llama-server itself serves each on a thread; an event loop would buy nothing here
and cost a dependency and a second concurrency model beside the suite's threads.

- The request goes upstream as it came: method, path and query, body, every header but the hop-by-hop ones (so
  ``Authorization`` passes through). The answer comes back the same way, each piece forwarded as it arrives
  (``iter_raw``: no decoding), chunked to the client when the server sent no length.
- A client that goes away cancels upstream as it would without the tap: a watcher sees its socket close (also
  while the server is still prefilling and nothing flows) and shuts the upstream connection, which llama-server
  takes as the client's disconnect.
- A recorded request (``exchange.RECORDED``) is handed to the ``Observer`` before it goes upstream, and each piece
  of the answer before it is forwarded; the observer's work never waits on the network.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from reusebench.tap.exchange import RECORDED

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
WATCH_S = 0.1  # how often the watcher looks at a client's socket
UPSTREAM_CONNECT_S = 5.0


class Observed(Protocol):
    """One recorded request's life, as the relay sees it."""

    def sending(self, headers: dict[str, str]) -> None: ...

    def answered(self, status: int) -> None: ...

    def piece(self, data: bytes) -> None: ...

    def ended(self, error: str | None) -> None: ...


class Observer(Protocol):
    def observe(self, path: str, body: bytes) -> Observed: ...

    def unrecorded(self, method: str, path: str) -> None: ...


class Relay:
    """Listens on `listen` (host, port) and relays to `upstream`; ``serve_forever`` in a thread, ``stop`` ends it
    (``close`` when it never served)."""

    def __init__(self, upstream: str, listen: tuple[str, int], observer: Observer,
                 timeout_s: float = 3600.0) -> None:
        self.upstream, self.observer = upstream.rstrip("/"), observer
        self.client = httpx.Client(base_url=self.upstream, timeout=httpx.Timeout(timeout_s, connect=UPSTREAM_CONNECT_S),
                                   limits=httpx.Limits(max_keepalive_connections=0))
        self.stopping: str | None = None  # why the relay stops, once it does
        self._active: set[_Handler] = set()
        self._lock = threading.Lock()
        relay = self

        class Handler(_Handler):
            pass

        Handler.relay = relay
        self.server = ThreadingHTTPServer(listen, Handler)
        self.server.daemon_threads = True

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.2)

    def stop(self, why: str, wait_s: float = 10.0) -> None:
        """Stop accepting; cut every request in flight (its observer hears `why`); wait for them to end."""
        self.stopping = why
        self.server.shutdown()
        with self._lock:
            active = list(self._active)
        for handler in active:
            handler.cut()
        for handler in active:
            handler.done.wait(wait_s)
        self.close()

    def close(self) -> None:
        """Release the listening socket and the upstream connections."""
        self.server.server_close()
        self.client.close()

    def _enter(self, handler: _Handler) -> bool:
        with self._lock:
            if self.stopping:
                return False
            self._active.add(handler)
            return True

    def _leave(self, handler: _Handler) -> None:
        with self._lock:
            self._active.discard(handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    relay: Relay

    def setup(self) -> None:
        super().setup()
        self.done = threading.Event()
        self.done.set()  # nothing in flight yet
        self._upstream_socket: socket.socket | None = None
        self._client_left = threading.Event()  # the client closed its connection mid-answer
        self._answered = threading.Event()  # the answer is over: the watcher ends

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass  # the client closed a kept-alive connection between requests

    def log_message(self, format: str, *args: object) -> None:
        """No access log: a path's query may carry what a client sent."""

    def do_GET(self) -> None:
        self._relay()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def cut(self) -> None:
        """End this request now (the relay stops): both sockets shut, so the stream and the watcher end."""
        for sock in (self._upstream_socket, self.connection):
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        relay = self.relay
        if not relay._enter(self):
            self.close_connection = True
            return
        self.done.clear()
        self._client_left.clear()
        self._answered.clear()
        try:
            self._exchange(relay)
        finally:
            relay._leave(self)
            self.done.set()

    def _exchange(self, relay: Relay) -> None:
        body = self._body()
        path = urlsplit(self.path).path
        observed = relay.observer.observe(path, body) if self.command == "POST" and path in RECORDED else None
        if observed is None:
            relay.observer.unrecorded(self.command, path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if observed is not None:
            observed.sending(headers)
        error: str | None = None
        try:
            request = relay.client.build_request(self.command, self.path, headers=headers, content=body)
            response = relay.client.send(request, stream=True)
            try:
                stream = response.extensions.get("network_stream")
                self._upstream_socket = stream.get_extra_info("socket") if stream is not None else None
                if observed is not None:
                    observed.answered(response.status_code)
                error = self._answer(response, observed)
            finally:
                response.close()
        except httpx.HTTPError as exc:  # no answer came: the client hears so from the tap
            error = relay.stopping or f"upstream: {type(exc).__name__}"
            self._fail(502, f"reusebench tap: the server did not answer ({type(exc).__name__})")
        finally:
            self._upstream_socket = None
            if observed is not None:
                observed.ended(error)

    def _answer(self, response: httpx.Response, observed: Observed | None) -> str | None:
        """Forward the answer; the error that cut it, or None."""
        self.send_response_only(response.status_code, response.reason_phrase)
        for name, value in response.headers.multi_items():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        length = response.headers.get("content-length")
        chunked = length is None and self.request_version == "HTTP/1.1"
        if length is not None:
            self.send_header("Content-Length", length)
        elif chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        watcher = threading.Thread(target=self._watch, name="tap-watch", daemon=True)
        try:
            self.end_headers()
            watcher.start()
            for data in response.iter_raw():
                if observed is not None:
                    observed.piece(data)
                self._write(data, chunked)
            self._write(b"", chunked)
            return None
        except OSError:  # writing to the client failed: it went away
            self.close_connection = True
            return self.relay.stopping or "client disconnected"
        except httpx.HTTPError as exc:  # the upstream stream broke: cut by the watcher, the stop, or the server
            self.close_connection = True  # the client sees its answer end early
            if self.relay.stopping:
                return self.relay.stopping
            return "client disconnected" if self._client_left.is_set() else f"upstream: {type(exc).__name__}"
        finally:
            self._answered.set()
            if watcher.is_alive():
                watcher.join()

    def _write(self, data: bytes, chunked: bool) -> None:
        if chunked:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        elif data:
            self.wfile.write(data)
        self.wfile.flush()

    def _watch(self) -> None:
        """While the answer is relayed: when the client's socket closes, shut the upstream one."""
        while not self._answered.wait(WATCH_S):
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                    self._client_gone()
                    return
            except OSError:
                self._client_gone()
                return

    def _client_gone(self) -> None:
        self._client_left.set()
        if self._upstream_socket is not None:
            try:
                self._upstream_socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _fail(self, status: int, message: str) -> None:
        try:
            data = json.dumps({"error": {"code": status, "message": message, "type": "tap_error"}}).encode()
            self.send_response_only(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

