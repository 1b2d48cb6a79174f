"""`reusebench site --serve`: the published asv site over HTTP, read-only, for a browser on this machine.

Anything that listens takes hostile input: files under the site's directory only (the
standard library's handler refuses paths that leave it), GET and HEAD only (501 for the
rest), a read timeout per connection (a client that sends nothing is cut off), and a cap on
connections at once (503 beyond it, ``listening.BoundedServer``). Loopback unless the user names another address.
"""

from __future__ import annotations

import functools
import http.server
from pathlib import Path
from typing import Any

from reusebench import listening

DEFAULT_LISTEN = ("127.0.0.1", 8080)
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
EXPOSED = "reads the site (the figures, commit hashes, machine names)"


class _Handler(http.server.SimpleHTTPRequestHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler sets it on the socket: every read waits at most this long

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
        pass  # the site's own files only; nothing to keep


class SiteServer(listening.BoundedServer):
    """The site's files, a thread per connection, at most `max_connections` at once."""

    def __init__(self, site: Path, listen: tuple[str, int] = DEFAULT_LISTEN, *, read_timeout_s: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        handler = type("Handler", (_Handler,), {"timeout": read_timeout_s})
        super().__init__(listen, functools.partial(handler, directory=str(site)), max_connections)

    @property
    def url(self) -> str:
        return super().url + "/"


def exposure_warning(host: str) -> str | None:
    return listening.exposure_warning(host, EXPOSED)
