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
  of the answer before it is forwarded; the observer's work never waits on the network, and nothing it raises
  stops the relaying (the request is recorded as not understood, with the class of the problem).
- Hostile input: only an origin-form target (``/path?query``) is relayed, always to the upstream, never to a host
  the client names (400); a body beyond ``max_body_bytes`` gets 413, a chunk-size line beyond ``MAX_LINE`` 400;
  a connection that sends nothing for ``read_timeout_s`` is closed; beyond ``max_connections`` at once, 503
  (``listening.BoundedServer``). Request and header lines are the standard library's to bound (65,536 bytes,
  100 headers). Each refusal is counted by a fixed reason, never with what the client sent.
"""

from __future__ import annotations

import json
import posixpath
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from reusebench.listening import BoundedServer
from reusebench.tap.exchange import RECORDED

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
WATCH_S = 0.1  # how often the watcher looks at a client's socket
UPSTREAM_CONNECT_S = 5.0
MAX_LINE = 1024  # a chunk-size line: hex digits and extensions
# why a request was refused or a connection closed: the summary counts these words, never what was sent
NOT_ORIGIN_FORM, BODY_TOO_LARGE, BAD_FRAMING, READ_TIMEOUT, TOO_MANY = (
    "not origin-form", "body too large", "bad framing", "read timeout", "too many connections")


@dataclass(frozen=True)
class RelayLimits:
    """What one client may hold of the tap; every default fits llama-server's own traffic with room."""

    max_body_bytes: int = 32 * 2**20  # a 128K-token prompt is about 1 MB as text or ids; images take more
    read_timeout_s: float = 60.0  # a client that sends nothing (between requests, too) for this long is closed
    max_connections: int = 64  # client connections at once, and so upstream connections at once


class Refused(Exception):
    """A request the relay does not forward: its status and the fixed reason the summary counts."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Observed(Protocol):
    """One recorded request's life, as the relay sees it."""

    def sending(self, headers: dict[str, str]) -> None: ...

    def answered(self, status: int) -> None: ...

    def piece(self, data: bytes) -> None: ...

    def ended(self, error: str | None) -> None: ...


class Observer(Protocol):
    def observe(self, path: str, body: bytes) -> Observed: ...

    def unrecorded(self, method: str, path: str) -> None: ...

    def refused(self, reason: str) -> None: ...

    def failed(self, problem: str) -> None: ...


class Relay:
    """Listens on `listen` (host, port) and relays to `upstream`; ``serve_forever`` in a thread, ``stop`` ends it
    (``close`` when it never served)."""

    def __init__(self, upstream: str, listen: tuple[str, int], observer: Observer,
                 timeout_s: float = 3600.0, limits: RelayLimits = RelayLimits()) -> None:
        self.upstream, self.observer, self.limits = upstream.rstrip("/"), observer, limits
        self.client = httpx.Client(base_url=self.upstream, timeout=httpx.Timeout(timeout_s, connect=UPSTREAM_CONNECT_S),
                                   limits=httpx.Limits(max_connections=limits.max_connections,
                                                       max_keepalive_connections=0))
        self.stopping: str | None = None  # why the relay stops, once it does
        self._active: set[_Handler] = set()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"relay": self, "timeout": limits.read_timeout_s})
        self.server = BoundedServer(listen, handler, limits.max_connections, lambda: observer.refused(TOO_MANY))

    @property
    def address(self) -> str:
        return self.server.url

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.2)

    def stop(self, why: str, wait_s: float = 60.0) -> int:
        """Stop accepting; cut every request in flight (its observer hears `why`); wait up to `wait_s` in all for
        them to end. Returns how many had not ended by then (their records come too late to be written)."""
        self.stopping = why
        self.server.shutdown()
        with self._lock:
            active = list(self._active)
        for handler in active:
            handler.cut()
        deadline = time.monotonic() + wait_s
        unfinished = sum(not handler.done.wait(max(0.0, deadline - time.monotonic())) for handler in active)
        self.close()
        return unfinished

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

    def log_error(self, format: str, *args: Any) -> None:
        if format.startswith("Request timed out"):  # the standard library's words for a read that timed out
            self.relay.observer.refused(READ_TIMEOUT)

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

    def _target(self) -> str:
        """The request's path and query: an origin-form target only, so that the upstream is the only host."""
        if not self.path.startswith("/") or self.path.startswith("//"):
            raise Refused(400, NOT_ORIGIN_FORM)
        return self.path

    def _body(self) -> bytes:
        limit = self.relay.limits.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            held = 0
            while True:
                line = self.rfile.readline(MAX_LINE + 1)
                try:
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    raise Refused(400, BAD_FRAMING) from None
                if len(line) > MAX_LINE or size < 0:
                    raise Refused(400, BAD_FRAMING)
                held += size
                if held > limit:
                    raise Refused(413, BODY_TOO_LARGE)
                if size == 0:
                    for _ in range(100):  # trailers, bounded as headers are
                        if not self.rfile.readline(MAX_LINE + 1).strip():
                            break
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(MAX_LINE + 1)
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            raise Refused(400, BAD_FRAMING)
        if int(length) > limit:
            raise Refused(413, BODY_TOO_LARGE)
        return self.rfile.read(int(length))

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
        try:
            target, body = self._target(), self._body()
        except Refused as refused:  # nothing is relayed, and the connection closes: its framing cannot be trusted
            relay.observer.refused(refused.reason)
            self.close_connection = True
            self._fail(refused.status, f"reusebench tap: {refused.reason}")
            return
        # the path as the server routes it ("/../completion" is "/completion"), for recording; relayed as sent
        path = posixpath.normpath(urlsplit(target).path or "/")
        observed = _Guarded.of(relay.observer, path, body) if self.command == "POST" and path in RECORDED else None
        if observed is None:
            relay.observer.unrecorded(self.command, path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if observed is not None:
            observed.sending(headers)
        error: str | None = None
        try:
            request = relay.client.build_request(self.command, relay.upstream + target, headers=headers, content=body)
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

    def _answer(self, response: httpx.Response, observed: _Guarded | None) -> str | None:
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
            return "client disconnected" if self._client_left.is_set() else self.relay.stopping or "client disconnected"
        except httpx.HTTPError as exc:  # the upstream stream broke: cut by the watcher, the stop, or the server
            self.close_connection = True  # the client sees its answer end early
            # what happened first decides, however late this thread gets here: the watcher marks the client's
            # leaving before it cuts the upstream, and a stop that comes after that does not rename it
            if self._client_left.is_set():
                return "client disconnected"
            return self.relay.stopping or f"upstream: {type(exc).__name__}"
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



class _Guarded:
    """An ``Observed`` whose failures cannot reach the relay: the first one is told to the observer by its class
    (``Observer.failed``), and after it only ``ended`` is called, so the request is still recorded."""

    def __init__(self, observer: Observer, observed: Observed | None, problem: str | None) -> None:
        self.observer, self.observed, self.problem = observer, observed, problem

    @classmethod
    def of(cls, observer: Observer, path: str, body: bytes) -> _Guarded:
        try:
            return cls(observer, observer.observe(path, body), None)
        except Exception as exc:
            observer.failed(type(exc).__name__)
            return cls(observer, None, type(exc).__name__)

    def _call(self, name: str, *args: Any) -> None:
        if self.observed is None or self.problem is not None:
            return
        try:
            getattr(self.observed, name)(*args)
        except Exception as exc:
            self.problem = type(exc).__name__
            self.observer.failed(self.problem)

    def sending(self, headers: dict[str, str]) -> None:
        self._call("sending", headers)

    def answered(self, status: int) -> None:
        self._call("answered", status)

    def piece(self, data: bytes) -> None:
        self._call("piece", data)

    def ended(self, error: str | None) -> None:
        if self.observed is None:
            return
        try:
            self.observed.ended(error if self.problem is None else f"not understood ({self.problem})")
        except Exception as exc:
            self.observer.failed(f"{type(exc).__name__} (no record)")
