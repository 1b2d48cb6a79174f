"""An image in a prompt's token ids: a run of negative ids of its own.

The server holds an image as one chunk of the prompt, matched whole or not at all by the image's id. Where the suite
compares prompts id by id (the perfect cache, the reuse model) an image stands for as many ids as the server gives
it tokens, negative (never a text token's) and distinct from every other image's from the first: two prompts then
share an image whole or not at all, as the server's chunks do.
"""

from __future__ import annotations

from collections.abc import Sequence

RUN_SPAN = 1 << 20  # ids one image's run may take: far more tokens than any projector gives an image


def run_ids(index: int, n_tokens: int) -> list[int]:
    """The ids image `index` stands for."""
    return [-(1 + index * RUN_SPAN + j) for j in range(n_tokens)]


def spans(tokens: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """(start, length) of each image's run in `tokens`, in order."""
    found: list[tuple[int, int]] = []
    start = None
    for i, token in enumerate(tokens):
        first_of_run = token < 0 and (-token - 1) % RUN_SPAN == 0
        if start is not None and (token >= 0 or first_of_run):
            found.append((start, i - start))
            start = None
        if first_of_run:
            start = i
    if start is not None:
        found.append((start, len(tokens) - start))
    return tuple(found)
