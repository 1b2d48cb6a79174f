"""`reusebench site --serve`: the published asv site over HTTP, read-only, for a browser on this machine.

Anything that listens takes hostile input: files under the site's directory only (the
standard library's handler refuses paths that leave it), GET and HEAD only (501 for the
rest), a read timeout per connection (a client that sends nothing is cut off), and a cap on
connections at once (503 beyond it). Loopback unless the user names another address.
"""

from __future__ import annotations

import functools
import http.server
import ipaddress
import socket
import threading
from pathlib import Path
from typing import Any

DEFAULT_LISTEN = ("127.0.0.1", 8080)
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32


class _Handler(http.server.SimpleHTTPRequestHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler sets it on the socket: every read waits at most this long

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
        pass  # the site's own files only; nothing to keep


class SiteServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once; the next is answered 503 and closed."""

    daemon_threads = True

    def __init__(self, site: Path, listen: tuple[str, int] = DEFAULT_LISTEN, *, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        handler = type("Handler", (_Handler,), {"timeout": read_timeout_s})
        super().__init__(listen, functools.partial(handler, directory=str(site)))
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a browser that leaves a page breaks the pipes of the loads it started: nothing to report

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"


def exposure_warning(host: str) -> str | None:
    """What serving on `host` exposes, when it is not loopback."""
    try:
        loopback = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        loopback = False
    return None if loopback else (f"warning: serving on {host}: anyone who reaches this address reads the site (the "
                                  "figures, commit hashes, machine names); there is no login")
