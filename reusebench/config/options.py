"""A variant's options as the profile gives them, and the one way to read one as a number."""

from __future__ import annotations

from collections.abc import Mapping

OptionValue = str | int | float | bool


def number(options: Mapping[str, OptionValue | None], name: str, default: float | None = None) -> float | None:
    """Option `name` as a number (a profile may write 300 or "300"), else `default`."""
    value = options.get(name)
    return default if value is None else float(str(value))
