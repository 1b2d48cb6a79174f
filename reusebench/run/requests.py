"""Building a session's requests: prompts as the server's own tokenizer gives them, for /completion and chat."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reusebench.config import scenarios
from reusebench.llama import facts
from reusebench.llama.client import Completion, ProgressCallback
from reusebench.records import Lora, text_hash
from reusebench.reuse import segments
from reusebench.run.session_server import SessionServer

Prompt = str | Sequence[int]
# (cache_prompt, progress, timeout_s) -> (completion, reply)
Send = Callable[[bool, ProgressCallback | None, float], tuple[Completion, str]]


@dataclass(frozen=True)
class Request:
    """One completion request, ready to send with or without reuse (the reference is the same call)."""

    endpoint: str
    tokens: list[int]  # the prompt as the server tokenizes it
    lora: Lora
    user_starts: tuple[int, ...]  # where user messages start (chat): the server may checkpoint there
    send: Send


class Requests:
    """Makes `Request`s for one server; tokenizes each text once."""

    def __init__(self, server: SessionServer, n_predict: int, *, whole: bool = False) -> None:
        self.server, self.n_predict, self.whole = server, n_predict, whole  # whole: unstreamed (speculation)
        self._tokens: dict[str, list[int]] = {}
        self._user_start: list[int] | None = None  # the chat template's user-message marker, asked once

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        key = f"{bos}:{text_hash(text)}:{len(text)}"
        if key not in self._tokens:
            self._tokens[key] = self.server.client.tokenize(text, add_special=bos)
        return self._tokens[key]

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        return self.tokens(prompt) if isinstance(prompt, str) else list(prompt)

    def completion(self, prompt: Prompt, lora: Lora) -> Request:
        # Sent as the token ids the session derived `ideal` from (the server's own tokenizer): the server prefills
        # exactly those, and spends no time tokenizing text outside its prompt time (~1 ms per 1K tokens here),
        # which would otherwise sit between the client's TTFT and the server's prompt_ms.
        tokens = self.prompt_tokens(prompt)
        handle, n_predict, whole = self.server, self.n_predict, self.whole

        def send(cache_prompt: bool, progress: ProgressCallback | None, timeout_s: float) -> tuple[Completion, str]:
            return handle.client.complete(tokens, n_predict=n_predict, cache_prompt=cache_prompt, lora=lora,
                                          on_progress=progress, timeout_s=timeout_s, whole=whole), ""

        return Request("/completion", tokens, lora, (), send)

    def chat(self, messages: scenarios.Messages) -> Request:
        messages = [dict(m) for m in messages]  # a deferred reference must send this turn, not a later one
        handle, n_predict, whole = self.server, self.n_predict, self.whole

        def send(cache_prompt: bool, progress: ProgressCallback | None, timeout_s: float) -> tuple[Completion, str]:
            return handle.client.chat(messages, n_predict=n_predict, cache_prompt=cache_prompt,
                                      on_progress=progress, timeout_s=timeout_s, whole=whole)

        # the server's own rendering, tokenized as it does (BOS added), so `ideal` compares what it compares
        tokens = self.tokens(handle.client.apply_template(messages))
        if self._user_start is None:
            marker = facts.user_start_marker(handle.client.apply_template)
            self._user_start = self.tokens(marker, bos=False) if marker else []
        user_starts = segments.user_starts(tokens, self._user_start)
        return Request("/v1/chat/completions", tokens, None, user_starts, send)
