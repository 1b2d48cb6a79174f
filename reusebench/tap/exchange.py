"""One recorded request as the tap reads it, in memory only: what its body asks (prompt, LoRA), the prompt's
token ids as the server makes them, and what the streamed or whole answer says (timings, slot, output ids).

Recorded endpoints are llama-server's completion routes: ``/completion`` (and ``/completions``),
``/v1/completions`` and ``/v1/chat/completions`` (and ``/chat/completions``). The prompt's ids come the server's
own way: a ``/completion`` prompt of ids is taken as it is; text goes through ``/tokenize`` with special tokens
added and parsed, as the completion routes tokenize (llama-server ``tokenize_input_prompts(..., true, true)``),
so a model that adds BOS counts it; chat messages are first rendered by ``/apply-template`` from the same body.
The count is checked against the server's own ``prompt_n + cache_n``.

Whatever a body or an answer holds, reading it raises nothing: what the tap cannot read is a fixed reason (the
request is recorded as not classed, with that reason), and a server's error is kept as its fixed ``type``
(llama-server's error types), never its message, which can quote the input.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from reusebench.llama.client import error_type
from reusebench.records import Lora

COMPLETION, OAI_COMPLETION, CHAT = "/completion", "/v1/completions", "/v1/chat/completions"
MAX_ID = 2**31 - 1  # a token id is an int32 in llama.cpp
MAX_ANSWER_BYTES = 64 * 2**20  # a whole (not streamed) answer held to be read; beyond it, relayed unread
TIMING_KEYS = ("prompt_n", "cache_n", "prompt_ms", "predicted_n", "predicted_ms")
RECORDED = {"/completion": COMPLETION, "/completions": COMPLETION, "/v1/completions": OAI_COMPLETION,
            "/v1/chat/completions": CHAT, "/chat/completions": CHAT}


@dataclass(frozen=True)
class Asked:
    """What a recorded request's body asks, held while it is in flight."""

    endpoint: str  # one of COMPLETION, OAI_COMPLETION, CHAT
    body: dict[str, Any]
    lora: Lora

    @property
    def ids(self) -> list[int] | None:
        """The prompt when the body sends token ids (a workload's ``/completion``)."""
        prompt = self.body.get("prompt")
        if self.endpoint != CHAT and isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        return None


def read_asked(path: str, body: bytes) -> Asked | str:
    """The request's ``Asked``, or why it cannot be classed (recorded all the same, with its counts)."""
    endpoint = RECORDED[path]
    try:
        parsed = json.loads(body or b"{}")
    except RecursionError:
        return "the body nests too deep"
    except ValueError:
        return "the body is not JSON"
    if not isinstance(parsed, dict):
        return "the body is not a JSON object"
    lora = _lora(parsed.get("lora"))
    if isinstance(lora, str):
        return lora
    prompt = parsed.get("prompt")
    if isinstance(prompt, list) and any(_is_id(p) and not 0 <= p <= MAX_ID for p in prompt):
        return "a token id out of range"
    asked = Asked(endpoint, parsed, lora)
    if endpoint == CHAT:
        return asked if isinstance(parsed.get("messages"), list) else "no messages"
    if isinstance(prompt, str) or asked.ids is not None:
        return asked
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, int)) for p in prompt):
        return asked  # text and ids mixed: /tokenize takes the same
    return "several prompts, or a prompt the tap does not read (multimodal)"


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _lora(given: object) -> Lora | str:
    """The adapters a request sets, as llama-server reads them (a missing scale is 0.0, its default), or why not."""
    if given is None:
        return None
    if not isinstance(given, list) or not all(isinstance(a, dict) and _is_id(a.get("id")) for a in given):
        return "a lora the tap does not read"
    scales = [a.get("scale", 0.0) for a in given]
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and abs(s) < 1e6 for s in scales):
        return "a lora the tap does not read"
    return [{"id": a["id"], "scale": float(s)} for a, s in zip(given, scales)]


@dataclass
class Tokenized:
    ids: list[int]
    ms: float  # what /apply-template and /tokenize took


def tokenize(asked: Asked, upstream: httpx.Client, headers: Mapping[str, str]) -> Tokenized:
    """The prompt's ids as the server makes them (raises httpx or ValueError errors for the caller to record)."""
    started = time.perf_counter()
    ids = asked.ids
    if ids is None:
        content: Any = asked.body.get("prompt")
        if asked.endpoint == CHAT:
            rendered = upstream.post("/apply-template", json=asked.body, headers=headers)
            rendered.raise_for_status()
            content = rendered.json()["prompt"]
        found = upstream.post("/tokenize", json={"content": content, "add_special": True, "parse_special": True},
                              headers=headers)
        found.raise_for_status()
        ids = [int(t) for t in found.json()["tokens"]]
    return Tokenized(ids, (time.perf_counter() - started) * 1000.0)


@dataclass
class Answer:
    """What the response says, fed as its bytes pass: its figures and output ids, never its text (an answer
    without ids, OpenAI-style without logprobs, is seen in the conversation's next prompt instead)."""

    streamed: bool
    timings: dict[str, Any] = field(default_factory=dict)
    id_slot: int | None = None
    ids: list[int] = field(default_factory=list)
    generated: bool = False  # some output came (ids or text)
    error: str | None = None
    first_token_at: float | None = None  # perf_counter seconds
    done: bool = False  # the final chunk (timings) came
    _pending: bytes = b""
    _whole: list[bytes] = field(default_factory=list)
    _held: int = 0

    def feed(self, data: bytes) -> None:
        if not self.streamed:
            if self._held + len(data) > MAX_ANSWER_BYTES:
                self.error, self._whole = "the answer is too large to read", []
                return
            self._held += len(data)
            self._whole.append(data)
            return
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                self._chunk(json.loads(payload))
            except (ValueError, TypeError, AttributeError, KeyError, RecursionError, OverflowError):
                continue  # a chunk the tap cannot read: the stream goes on

    def finish(self) -> None:
        if not self.streamed and self._whole:
            try:
                self._chunk(json.loads(b"".join(self._whole)))
            except (ValueError, TypeError, AttributeError, KeyError, RecursionError, OverflowError):
                self.error = self.error or "the answer is not JSON the tap reads"
            self._whole = []

    def _chunk(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            self.error = f"server {error_type(obj['error'])}"  # never the message: it can quote the input
            return
        if "prompt_progress" in obj:
            return  # a progress event carries no output
        ids = [int(t) for t in obj.get("tokens") or [] if _is_id(t)]
        choices = [c for c in obj.get("choices") or [] if isinstance(c, dict)]
        for choice in choices:
            said = choice.get("delta") or choice.get("message") or {}
            if (isinstance(said, dict) and said.get("content")) or choice.get("text"):
                self.generated = True
            logprobs = choice.get("logprobs") or {}
            content = logprobs.get("content") if isinstance(logprobs, dict) else None
            ids += [e["id"] for e in content or [] if isinstance(e, dict) and _is_id(e.get("id"))]
        self.generated = self.generated or bool(ids or obj.get("content"))
        if self.generated and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.ids += ids
        if isinstance(obj.get("id_slot"), int):
            self.id_slot = obj["id_slot"]
        timings = obj.get("timings")
        if isinstance(timings, dict) and timings and all(
                isinstance(timings.get(k, 0), (int, float)) and not isinstance(timings.get(k, 0), bool)
                and abs(timings.get(k, 0)) < 2**53 for k in TIMING_KEYS):
            self.timings = timings
        finished = obj.get("stop") is True or any(c.get("finish_reason") for c in choices)
        self.done = self.done or bool(self.timings and (finished or not self.streamed))
