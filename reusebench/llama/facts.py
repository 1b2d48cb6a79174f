"""Facts about llama-server b11434 that more than one part of the library relies on, each written down once.

The reuse model (``reuse.expectation``), the option check (``check``), advice and the tiny models' chat
template all read them from here; docs/llama-server-reuse.md gives each its source line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The defaults of the options that decide reuse.
DEFAULT_BATCH, DEFAULT_UBATCH = 2048, 512
DEFAULT_CTX_CHECKPOINTS = 32
DEFAULT_CHECKPOINT_MIN_STEP = 8192
DEFAULT_CACHE_RAM_MIB = 8192
DEFAULT_SLOT_PROMPT_SIMILARITY = 0.10
AUTO_SLOTS = 4  # -np auto: 4 slots with a unified KV cache
END_OFFSETS = 4  # checkpoints 4 and 4 + n_ubatch tokens before the end of a prompt
F_KEEP_SAVE = 0.5  # a slot picked by similarity is saved to RAM when less than this share of it is kept
F_KEEP_LOAD = 0.25  # a RAM entry is never loaded when less than this share of it is kept
# An image's place in a prompt string: random at every start of b11434 unless the environment pins it, which the
# suite does so that a request made before a restart can be sent after it; a build that reads no such variable uses
# its fixed "<__media__>", and /props names the marker either way
MEDIA_MARKER_ENV, MEDIA_MARKER = "LLAMA_MEDIA_MARKER", "<__reusebench_media__>"
# With it set, the server logs each verified speculative draft (accepted of drafted, and whether a speculative
# checkpoint undid it: server-context.cpp 4283, 4311); nothing else reads it, and the lines carry no text
TRACE_ENV = "LLAMA_TRACE"

# A request's `lora` that turns every adapter off. Explicit: a request without `lora` runs the server's global
# adapters, which --lora applies at scale 1 (this build ignores --lora-init-without-apply: /lora-adapters still
# reports 1.0).
NO_LORA = [{"id": 0, "scale": 0.0}]

# ChatML, the tiny models' chat template, and where a user message starts in a prompt it renders: the chat
# endpoints pass that marker to the server as a message delimiter, and /completion takes it in
# `message_delimiters`.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_USER_START = "<|im_start|>user"
USER_PROBE = "reusebench user message"  # a message text no template changes


def user_start_marker(render: Callable[[list[dict[str, str]]], str]) -> str:
    """Where a user message starts in a template's prompts: the text a user message's content follows (for
    ChatML, CHATML_USER_START; for Gemma, "<start_of_turn>user"), as llama-server's autoparser finds its message
    delimiter (`common/chat-diff-analyzer.cpp:389`); "" when the template shows none."""
    rendered = render([{"role": "user", "content": USER_PROBE}])
    return rendered[: max(0, rendered.find(USER_PROBE))].strip()


def end_checkpoint_offsets(n_batch: int, n_ubatch: int) -> tuple[int, int]:
    """How many tokens before a prompt's end its two last checkpoints sit: 4 + n_ubatch and 4, each at most one
    batch."""
    return min(n_batch, END_OFFSETS + n_ubatch), min(n_batch, END_OFFSETS)


def message_delimiters() -> dict[str, Any]:
    """The /completion fields that mark where each ChatML user message starts (so the server checkpoints there)."""
    return {"message_delimiters": [{"role": "user", "delimiter": CHATML_USER_START}]}
