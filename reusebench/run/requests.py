"""Building a session's requests: prompts as the server's own tokenizer gives them, for /completion and chat.

A text with image placeholders (``config.images``) is sent with its images: to ``/completion`` as a prompt string
with the server's media marker and ``multimodal_data`` (the server takes images only with a string), to chat as
``image_url`` parts. Its tokens are what the server makes of it: each text piece tokenized on its own (BOS before the
first), each image the run of ids its measured token count gives it (``Media``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reusebench.config import images as images_mod
from reusebench.config import scenarios
from reusebench.llama import facts, media
from reusebench.llama.client import Completion, MediaPrompt, ProgressCallback
from reusebench.records import Lora, text_hash
from reusebench.reuse import image_runs, segments
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
    images: tuple[tuple[int, int], ...] = ()  # (start, length) of each image in `tokens`


@dataclass(frozen=True)
class Media:
    """A corpus's images as this server takes them: each image's tokens (measured) and the server's media marker."""

    images: tuple[media.Image, ...]
    n_tokens: Mapping[int, int]  # image index -> the tokens the server gives it
    marker: str

    def prompt(self, text: str) -> MediaPrompt:
        """`text` as /completion takes it: the marker where each image goes, the images in order."""
        order = [part for part in images_mod.split(text) if isinstance(part, int)]
        return MediaPrompt(images_mod.PLACEHOLDER.sub(self.marker, text),
                           tuple(self.images[k].base64() for k in order))

    def content(self, text: str) -> list[dict[str, Any]]:
        """`text` as a chat message's content parts."""
        return [{"type": "text", "text": part} if isinstance(part, str) else
                {"type": "image_url", "image_url": {"url": self.images[part].data_url()}}
                for part in images_mod.split(text)]


class Requests:
    """Makes `Request`s for one server; tokenizes each text once."""

    def __init__(self, server: SessionServer, n_predict: int, *, whole: bool = False) -> None:
        self.server, self.n_predict, self.whole = server, n_predict, whole  # whole: unstreamed (speculation)
        self._tokens: dict[str, list[int]] = {}
        self._user_start: list[int] | None = None  # the chat template's user-message marker, asked once
        self.media: Media | None = None  # once the corpus's images are measured (``SessionSteps.build_corpus``)

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        if images_mod.has_images(text):
            return self._tokens_with_images(text, bos)
        key = f"{bos}:{text_hash(text)}:{len(text)}"
        if key not in self._tokens:
            self._tokens[key] = self.server.client.tokenize(text, add_special=bos)
        return self._tokens[key]

    def _tokens_with_images(self, text: str, bos: bool) -> list[int]:
        """As mtmd tokenizes it: each text piece on its own, BOS before the first piece (an image's too)."""
        assert self.media is not None, "a text with images before the corpus's images were measured"
        tokens = list(self.tokens("", bos=True)) if bos else []
        for part in images_mod.split(text):
            tokens += self.tokens(part, bos=False) if isinstance(part, str) else image_runs.run_ids(
                part, self.media.n_tokens[part])
        return tokens

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        return self.tokens(prompt) if isinstance(prompt, str) else list(prompt)

    def completion(self, prompt: Prompt, lora: Lora) -> Request:
        # Sent as the token ids the session derived `ideal` from (the server's own tokenizer): the server prefills
        # exactly those, and spends no time tokenizing text outside its prompt time (~1 ms per 1K tokens here),
        # which would otherwise sit between the client's TTFT and the server's prompt_ms.
        tokens = self.prompt_tokens(prompt)
        handle, n_predict, whole = self.server, self.n_predict, self.whole
        sent: list[int] | MediaPrompt = tokens
        if isinstance(prompt, str) and images_mod.has_images(prompt):
            assert self.media is not None
            if tokens[-1] < 0:
                raise ValueError("a prompt that ends with an image: llama-server b11434 aborts on it "
                                 "(server-context.cpp, GGML_ASSERT(batch.size() > 0))")
            sent = self.media.prompt(prompt)
        elif any(t < 0 for t in tokens):
            raise ValueError("a prompt of token ids cannot carry an image: /completion takes images with a string")

        def send(cache_prompt: bool, progress: ProgressCallback | None, timeout_s: float) -> tuple[Completion, str]:
            return handle.client.complete(sent, n_predict=n_predict, cache_prompt=cache_prompt, lora=lora,
                                          on_progress=progress, timeout_s=timeout_s, whole=whole), ""

        return Request("/completion", tokens, lora, (), send, image_runs.spans(tokens) if self.media else ())

    def chat(self, messages: scenarios.Messages) -> Request:
        sent = [self._message(m) for m in messages]  # a deferred reference must send this turn, not a later one
        handle, n_predict, whole = self.server, self.n_predict, self.whole

        def send(cache_prompt: bool, progress: ProgressCallback | None, timeout_s: float) -> tuple[Completion, str]:
            return handle.client.chat(sent, n_predict=n_predict, cache_prompt=cache_prompt,
                                      on_progress=progress, timeout_s=timeout_s, whole=whole)

        # the server's own rendering, tokenized as it does (BOS added), so `ideal` compares what it compares
        tokens = self.tokens(self._placeholders(handle.client.apply_template(sent), messages))
        if self._user_start is None:
            marker = facts.user_start_marker(handle.client.apply_template)
            self._user_start = self.tokens(marker, bos=False) if marker else []
        user_starts = segments.user_starts(tokens, self._user_start)
        return Request("/v1/chat/completions", tokens, None, user_starts, send,
                       image_runs.spans(tokens) if self.media else ())

    def _message(self, message: Mapping[str, str]) -> dict[str, Any]:
        content = message["content"]
        if self.media is None or not images_mod.has_images(content):
            return dict(message)
        return {**message, "content": self.media.content(content)}

    def _placeholders(self, rendered: str, messages: scenarios.Messages) -> str:
        """The rendered chat with our placeholders back where the template put the server's marker, in order."""
        if self.media is None:
            return rendered
        order = iter([part for m in messages for part in images_mod.split(m["content"]) if isinstance(part, int)])
        pieces = rendered.split(self.media.marker)
        return "".join(piece if k == 0 else images_mod.placeholder(next(order)) + piece
                       for k, piece in enumerate(pieces))
