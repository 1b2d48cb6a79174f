"""A small httpx client for the llama-server endpoints the suite uses.

Completions stream with ``return_progress`` so the client sees the first
prompt-progress event (client-side time to first byte), a progress callback can
draw a bar on long prefills, and the time to the first generated token is
measured on the client. Responses are reduced to counts, times, token ids and
log-probabilities: prompt and output text are never kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class MediaPrompt:
    """A prompt with images: its text with the server's media marker where each goes, and the images (base64) in
    the markers' order (``/completion``'s ``multimodal_data``; a multimodal prompt cannot be token ids)."""

    text: str
    media: tuple[str, ...]


Prompt = str | Sequence[int] | MediaPrompt
# (processed, cached, total) on every prompt-progress event; a true result ends the stream there (StreamEnded)
ProgressCallback = Callable[[int, int, int], bool | None]
LEGACY_MEDIA_MARKER = "<__media__>"  # the marker of a build whose /props names none
CONNECT_TIMEOUT_S = 5.0  # a loopback server that does not accept within this is not answering
# every client of llama-server asks for a connection per request: the server closes one after a streamed response
# and one idle for 5 s (cpp-httplib's keep-alive timeout, also httpx's expiry), and a pooled connection reused as it
# closes fails the next request with no answer
ONE_REQUEST_PER_CONNECTION = {"Connection": "close"}


# llama-server's error types (tools/server/server-common.cpp, format_error_response): kept as they are; any other
# error is "error"
ERROR_TYPES = frozenset({"invalid_request_error", "authentication_error", "not_found_error", "server_error",
                         "permission_error", "not_supported_error", "unavailable_error", "exceed_context_size_error"})


def error_type(error: object) -> str:
    """A server's error object as records keep it: its type when it is one of llama-server's, else "error"; never
    its message, which may quote the request."""
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) and kind in ERROR_TYPES else "error"


class ClientError(RuntimeError):
    """An HTTP call failed; ``status`` is the HTTP status, or None when no answer came. The message, for the user,
    carries the server's own words; ``recorded``, for records, only its status and error type."""

    def __init__(self, message: str, status: int | None = None, recorded: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.recorded = message if recorded is None else recorded


def recorded_error(exc: BaseException) -> str:
    """What a record keeps of a failed call: a ClientError's words without the server's, another error as it is."""
    return exc.recorded if isinstance(exc, ClientError) else str(exc)


class StreamEnded(ClientError):
    """The progress callback ended a stream: the connection is closed (the server drops the task) and the
    prompt-progress numbers seen last are kept: ``total - cached`` is what the server would have re-processed."""

    def __init__(self, path: str, processed: int, cached: int, total: int) -> None:
        super().__init__(f"POST {path}: ended by the progress callback at {processed:,}/{total:,} tokens")
        self.processed, self.cached, self.total = processed, cached, total


@dataclass(frozen=True)
class TokenProbs:
    """One generated token and its top alternatives as (token id, logprob) pairs."""

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass
class Completion:
    """What one completion call measured. No text: token ids and numbers only."""

    prompt_n: int
    cache_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    tokens_evaluated: int
    id_slot: int | None
    ttft_ms: float | None
    wall_ms: float
    tokens: list[int] = field(default_factory=list)
    probs: list[TokenProbs] = field(default_factory=list)
    status: int = 200
    draft_n: int | None = None  # speculative decoding: tokens drafted, and accepted (None: no speculation)
    draft_accepted: int | None = None


def _prompt_json(prompt: Prompt) -> Any:
    if isinstance(prompt, MediaPrompt):
        return {"prompt_string": prompt.text, "multimodal_data": list(prompt.media)}
    return prompt if isinstance(prompt, str) else list(prompt)


def _timings(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("timings") or {}


def _token_probs(entries: list[dict[str, Any]]) -> list[TokenProbs]:
    return [
        TokenProbs(
            id=int(e["id"]),
            logprob=float(e.get("logprob", 0.0)),
            top=tuple((int(t["id"]), float(t.get("logprob", 0.0))) for t in e.get("top_logprobs", [])),
        )
        for e in entries
    ]


class LlamaClient:
    """Endpoints of one running llama-server (``base_url``), authenticated with ``api_key``."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 3600.0) -> None:
        headers = dict(ONE_REQUEST_PER_CONNECTION)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> LlamaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ClientError(f"{method} {path}: timed out ({exc.__class__.__name__})") from exc
        except httpx.TransportError as exc:
            raise ClientError(f"{method} {path}: no answer ({exc})") from exc
        if response.status_code >= 400:
            raise _http_error(f"{method} {path}", response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -- completions ------------------------------------------------------------------------

    def complete(
        self,
        prompt: Prompt,
        *,
        n_predict: int,
        cache_prompt: bool | None = True,
        lora: Sequence[Mapping[str, float]] | None = None,
        id_slot: int | None = None,
        n_probs: int = 5,
        on_progress: ProgressCallback | None = None,
        extra: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        whole: bool = False,
    ) -> Completion:
        """Greedy ``/completion``, streamed (``whole``: answered at once, no progress). ``prompt`` is text, token
        ids or text with images.

        ``timeout_s`` bounds the whole call (prefill and generation); a server that
        stops sending (hung, stopped) fails it at the latest then. ``cache_prompt=None``
        leaves the field out, so the server's ``--cache-prompt`` default decides.
        """
        body: dict[str, Any] = {
            "prompt": _prompt_json(prompt),
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "seed": 0,
            "cache_prompt": cache_prompt,
            "n_probs": n_probs,
            "stream": True,
            "return_progress": True,
        }
        if cache_prompt is None:
            del body["cache_prompt"]
        if lora is not None:
            body["lora"] = [dict(adapter) for adapter in lora]
        if id_slot is not None:
            body["id_slot"] = id_slot
        body.update(extra or {})
        if whole:  # unstreamed, the ids come only when asked for
            return self._whole("/completion", {**body, "return_tokens": True}, _completion_chunk, timeout_s)
        return self._stream("/completion", body, on_progress, _completion_chunk, timeout_s)

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        n_predict: int,
        cache_prompt: bool = True,
        n_probs: int = 5,
        on_progress: ProgressCallback | None = None,
        timeout_s: float | None = None,
        whole: bool = False,
    ) -> tuple[Completion, str]:
        """Greedy ``/v1/chat/completions``, streamed (``whole``: answered at once, no progress); returns the
        measurement and the reply text.

        The measurement carries the generated token ids and top logprobs (OpenAI
        ``logprobs``; llama-server adds the ids), as ``complete`` does. The reply
        text is returned only so a growing conversation can append it; callers
        must not store it.
        """
        body = {
            "messages": messages,
            "max_tokens": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "seed": 0,
            "cache_prompt": cache_prompt,
            "logprobs": True,
            "top_logprobs": n_probs,
            "stream": True,
            "return_progress": True,
        }
        reply: list[str] = []

        def chunk(obj: dict[str, Any], acc: _Accumulator) -> None:
            for choice in obj.get("choices", []):
                piece = (choice.get("delta") or choice.get("message") or {}).get("content")
                if piece:
                    reply.append(piece)
                    acc.first_token()
                generated = (choice.get("logprobs") or {}).get("content") or []
                acc.tokens.extend(int(e["id"]) for e in generated)
                acc.probs.extend(_token_probs(generated))
            acc.timings = _timings(obj) or acc.timings

        completion = (self._whole("/v1/chat/completions", body, chunk, timeout_s) if whole else
                      self._stream("/v1/chat/completions", body, on_progress, chunk, timeout_s))
        return completion, "".join(reply)

    def _whole(self, path: str, body: dict[str, Any], on_answer: Callable[[dict[str, Any], _Accumulator], None],
               timeout_s: float | None = None) -> Completion:
        """One unstreamed call: its answer read as a stream's one last chunk; no progress, no time to first
        token."""
        acc = _Accumulator(time.perf_counter())
        response = self._request("POST", path, json={**body, "stream": False, "return_progress": False},
                                 **_timeout(timeout_s))
        answer = response.json()
        on_answer({**answer, "stop": True}, acc)  # each endpoint's reader takes the timings of a last chunk
        acc.t_first_token = None
        return acc.result()

    def _stream(
        self,
        path: str,
        body: dict[str, Any],
        on_progress: ProgressCallback | None,
        on_chunk: Callable[[dict[str, Any], _Accumulator], None],
        timeout_s: float | None = None,
    ) -> Completion:
        acc = _Accumulator(time.perf_counter())
        # the deadline counts from the last sign of progress: a server that is slowed down (a loaded machine) is not
        # a hung one, and each prefill batch or generated token moves it on
        deadline = None if timeout_s is None else acc.t0 + timeout_s
        last: tuple[object, int] | None = None
        try:
            with self.http.stream("POST", path, json=body, **_timeout(timeout_s)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _http_error(f"POST {path}", response)
                for obj in _sse_objects(response.iter_lines()):
                    progress = obj.get("prompt_progress")
                    if progress is not None and on_progress:
                        numbers = (int(progress.get("processed", 0)), int(progress.get("cache", 0)),
                                   int(progress.get("total", 0)))
                        if on_progress(*numbers):
                            raise StreamEnded(path, *numbers)  # leaving the block closes the response
                    on_chunk(obj, acc)
                    if timeout_s is None or deadline is None:
                        continue
                    now, moved = time.perf_counter(), (progress, len(acc.tokens))
                    if moved != last:
                        last, deadline = moved, now + timeout_s
                    elif now > deadline:
                        raise ClientError(f"POST {path}: timed out: no progress for {timeout_s:.0f} s (still streaming)")
        except httpx.TimeoutException as exc:
            budget = "" if timeout_s is None else f" after {timeout_s:.0f} s"
            raise ClientError(f"POST {path}: timed out{budget} ({exc.__class__.__name__})") from exc
        except httpx.TransportError as exc:
            raise ClientError(f"POST {path}: connection lost ({exc})") from exc
        return acc.result()

    # -- tokenizer --------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return list(self._json("POST", "/tokenize", json={"content": text, "add_special": add_special})["tokens"])

    def apply_template(self, messages: list[dict[str, Any]]) -> str:
        """The prompt ``/v1/chat/completions`` builds from ``messages`` (``/apply-template``)."""
        return str(self._json("POST", "/apply-template", json={"messages": messages})["prompt"])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self._json("POST", "/detokenize", json={"tokens": list(tokens)})["content"])

    # -- state and configuration ------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return dict(self._json("GET", "/health"))

    def props(self) -> dict[str, Any]:
        """``/props``; does not wake a sleeping server."""
        return dict(self._json("GET", "/props"))

    def media_marker(self) -> str:
        """Where a prompt string puts an image: ``/props``'s ``media_marker``, or the fixed one of a build that names
        none."""
        return str(self.props().get("media_marker") or LEGACY_MEDIA_MARKER)

    def slots(self) -> list[dict[str, Any]]:
        """``GET /slots``. Wakes a sleeping server: never call it in sleep scenarios."""
        return list(self._json("GET", "/slots"))

    def metrics(self) -> dict[str, float]:
        """Prometheus ``/metrics`` as {name: value}; needs ``--metrics``; does not wake the server."""
        return parse_prometheus(self._request("GET", "/metrics").text)

    def slot_save(self, slot: int, filename: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return dict(self._json("POST", f"/slots/{slot}", params={"action": "save"}, json={"filename": filename},
                               **_timeout(timeout_s)))

    def slot_restore(self, slot: int, filename: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return dict(self._json("POST", f"/slots/{slot}", params={"action": "restore"}, json={"filename": filename},
                               **_timeout(timeout_s)))

    def slot_erase(self, slot: int) -> dict[str, Any]:
        return dict(self._json("POST", f"/slots/{slot}", params={"action": "erase"}))

    def lora_adapters(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/lora-adapters"))



class _Accumulator:
    """Collects one streamed completion's timings, tokens and log-probabilities."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.t_first_token: float | None = None
        self.timings: dict[str, Any] = {}
        self.tokens: list[int] = []
        self.probs: list[TokenProbs] = []
        self.final: dict[str, Any] = {}

    def first_token(self) -> None:
        if self.t_first_token is None:
            self.t_first_token = time.perf_counter()

    def result(self) -> Completion:
        end = time.perf_counter()
        t = self.timings
        if not t:
            raise ClientError("stream ended without timings: the server closed the response early")
        prompt_n = int(t.get("prompt_n", 0))
        cache_n = int(t.get("cache_n", 0))
        return Completion(
            prompt_n=prompt_n,
            cache_n=cache_n,
            prompt_ms=float(t.get("prompt_ms", 0.0)),
            predicted_n=int(t.get("predicted_n", 0)),
            predicted_ms=float(t.get("predicted_ms", 0.0)),
            tokens_evaluated=int(self.final.get("tokens_evaluated", prompt_n + cache_n)),
            id_slot=self.final.get("id_slot"),
            ttft_ms=None if self.t_first_token is None else (self.t_first_token - self.t0) * 1000.0,
            wall_ms=(end - self.t0) * 1000.0,
            tokens=self.tokens,
            probs=self.probs,
            draft_n=None if t.get("draft_n") is None else int(t["draft_n"]),
            draft_accepted=None if t.get("draft_n_accepted") is None else int(t["draft_n_accepted"]),
        )


def _completion_chunk(obj: dict[str, Any], acc: _Accumulator) -> None:
    if "prompt_progress" in obj:  # progress events carry a placeholder token, not output
        return
    tokens = obj.get("tokens") or []
    if tokens:
        acc.first_token()
        acc.tokens.extend(int(t) for t in tokens)
    acc.probs.extend(_token_probs(obj.get("completion_probabilities") or []))
    if obj.get("timings") and obj.get("stop"):
        acc.timings = obj["timings"]
        acc.final = {k: obj.get(k) for k in ("tokens_evaluated", "id_slot", "tokens_cached")}


def _sse_objects(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        obj = json.loads(payload)
        if "error" in obj:
            raise ClientError(f"server error in stream: {obj['error'].get('message', obj['error'])}")
        yield obj


def _timeout(timeout_s: float | None) -> dict[str, Any]:
    return {} if timeout_s is None else {"timeout": httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)}


def _http_error(call: str, response: httpx.Response) -> ClientError:
    """An answer with an error status: the server's message for the user, its type for records."""
    try:
        err = response.json().get("error", {})
        message = str(err.get("message", err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        err, message = None, response.text[:200]
    return ClientError(f"{call}: HTTP {response.status_code}: {message}", response.status_code,
                       recorded=f"{call}: HTTP {response.status_code} ({error_type(err)})")


def parse_prometheus(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            continue
    return values
