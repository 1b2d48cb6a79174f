"""How the tap names what it does not record, never in a client's own words: an unrecorded request by a fixed
method and llama-server route, the upstream without its credentials."""

from __future__ import annotations

from urllib.parse import urlsplit

from reusebench.tap import exchange

METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"})
# llama-server b11434's routes (tools/server/server.cpp): an unrecorded request is counted by one of these, else
# "other", so that a client's own strings never reach the summary
ROUTES = frozenset({
    "/", "/health", "/v1/health", "/metrics", "/props", "/slots", "/models", "/v1/models", "/models/load",
    "/models/unload", "/models/sse", "/tokenize", "/detokenize", "/apply-template", "/embedding", "/embeddings",
    "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/infill", "/lora-adapters",
    "/responses", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/audio/transcriptions",
    "/tools", "/cors-proxy", *exchange.RECORDED})
OTHER = "other"


def route_name(method: str, path: str) -> str:
    """How an unrecorded request is counted: a fixed method and route, never the client's own words."""
    route = path if path in ROUTES else "/slots/ID" if path.startswith("/slots/") and path[7:].isdigit() else OTHER
    return f"{method if method in METHODS else OTHER} {route}"


def redacted(url: str) -> str:
    """`url` without its credentials (http://user:pass@host -> http://***@host), wherever the tap names it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()
