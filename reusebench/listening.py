"""What every reusebench server that listens shares (the tap's relay, `reusebench site --serve`): a thread per
connection with a cap on connections at once (503 beyond it), no traceback for a client that went away, and what
listening beyond loopback exposes.

Anything that listens takes hostile input; each one adds its own size limits and read timeout to its handler.
"""

from __future__ import annotations

import http.server
import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class BoundedServer(http.server.ThreadingHTTPServer):
    """At most `max_connections` connections served at once; the next is answered 503 and closed, and
    `on_busy` hears of it."""

    daemon_threads = True
    # the listen backlog: the standard library's 5 overflows when a few clients connect at once on a loaded machine,
    # and the kernel then drops their SYNs, each retried a second or more later (llama-server's cpp-httplib uses 128)
    request_queue_size = 128

    def __init__(self, listen: tuple[str, int], handler: Callable[..., Any], max_connections: int,
                 on_busy: Callable[[], None] = lambda: None) -> None:
        super().__init__(listen, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._on_busy = on_busy

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            self._on_busy()
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread started: nobody else gives the slot back
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that left mid-answer breaks a pipe: nothing to report, and no text to print

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def exposure_warning(host: str, exposed: str) -> str | None:
    """What listening on `host` exposes (`exposed`), when it is not loopback; None on loopback."""
    if is_loopback(host):
        return None
    return f"warning: listening on {host}: anyone who reaches this address {exposed}; there is no login"


def wait_listening(url: str, alive: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Whether `url` answers HTTP within `timeout_s`, while `alive()` says its process still runs (a server started
    as a process of its own, such as `reusebench tap`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            httpx.get(url, timeout=2)
            return True
        except httpx.TransportError:
            time.sleep(0.1)
    return False
