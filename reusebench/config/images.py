"""Where a document's images go: a placeholder in its text for each (``placeholder``), by the image's number in the
corpus (``corpus.Corpus.images``).

The requests turn a placeholder into the server's media marker (``/completion``'s ``multimodal_data``) or an
``image_url`` part (chat), and count the image as a run of ids of its own (``reuse.image_runs``) wherever a prompt is
compared token by token: one image matches another whole or not at all, as the server matches its chunks by the
image's id. The images themselves: ``llama.media``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PLACEHOLDER = re.compile(r"<\|reusebench-image-(\d+)\|>")


def placeholder(index: int) -> str:
    return f"<|reusebench-image-{index}|>"


def place(text: str, at: Sequence[float], first_index: int) -> str:
    """`text` with placeholders ``first_index``, ``first_index + 1``, ... at the word breaks nearest each fraction of
    its length (in order), so the text around an image tokenizes as it did without it."""
    cuts = []
    for fraction in at:
        target = int(len(text) * fraction)
        before = max(text.rfind(" ", 0, target + 1), text.rfind("\n", 0, target + 1))
        cuts.append(before if before >= 0 else target)
    pieces, last = [], 0
    for k, cut in enumerate(cuts):
        pieces += [text[last:cut], placeholder(first_index + k)]
        last = cut
    return "".join([*pieces, text[last:]])


def split(text: str) -> list[str | int]:
    """`text` as its pieces of text and image indices, in order (empty texts left out)."""
    parts: list[str | int] = []
    last = 0
    for match in PLACEHOLDER.finditer(text):
        if match.start() > last:
            parts.append(text[last:match.start()])
        parts.append(int(match.group(1)))
        last = match.end()
    if last < len(text):
        parts.append(text[last:])
    return parts


def has_images(text: str) -> bool:
    return PLACEHOLDER.search(text) is not None
