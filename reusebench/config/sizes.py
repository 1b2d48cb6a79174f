"""Prompt sizes in tokens: the one parser of "32K" (command line, profiles, asv selection) and its label.

Accepted: a positive whole number of tokens, as an integer or as digits with an
optional binary suffix, K (x 1024) or M (x 1024 x 1024), in either case: 2048, 32K,
128k, 1M. Nothing else: no zero, no sign, no fractions, no "KB".
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"([0-9]+)([KkMm]?)")
_UNITS = {"": 1, "k": 1024, "m": 1024 * 1024}
FORMS = "a positive token count such as 2048, 32K or 1M"


class SizeError(ValueError):
    """Not a size; the message says what was given and what is accepted (callers prefix where it came from)."""


def parse_size(value: object) -> int:
    """Tokens in `value` (an int, or text like "32K"); SizeError for anything else or for less than one token."""
    if isinstance(value, int) and not isinstance(value, bool):  # `sizes: [true]` is a mistake, not 1
        tokens = value
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value.strip())):
        tokens = int(match.group(1)) * _UNITS[match.group(2).lower()]
    else:
        raise SizeError(f"expected {FORMS}, got {value!r}")
    if tokens < 1:
        raise SizeError(f"expected {FORMS}, got {value!r}")
    return tokens


def size_label(tokens: int) -> str:
    """"32K" for 32768; a size that is not a whole number of K as its digits. asv parameter values: keep stable."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)
