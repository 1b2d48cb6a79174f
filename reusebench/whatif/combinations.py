"""What `whatif --try` asks: launch options with several values each, and every combination of them as a variant
of the profile's, checked against the binary's --help before anything is predicted.

Only options the reuse model decides on can be tried (``TRIABLE``); each value is read with its option's type.
A flag that is on or off (``kv-unified``) is tried as on/off and written the way llama-server spells each
(``--kv-unified``, ``--no-kv-unified``).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from reusebench.config.options import OptionValue
from reusebench.config.profiles import Variant
from reusebench.llama import binaries
from reusebench.llama.binaries import HelpOption

ON, OFF = ("on", "true", "1", "yes"), ("off", "false", "0", "no")


def _flag(text: str) -> bool:
    if text.lower() in ON:
        return True
    if text.lower() in OFF:
        return False
    raise ValueError(f"expected on or off, got {text!r}")


def _count(text: str) -> int:
    return int(text)


# the option, how its values are read, and (for on/off) the flags that say on and off
TRIABLE: dict[str, tuple[Callable[[str], OptionValue], tuple[str, str] | None]] = {
    "parallel": (_count, None),
    "cache-ram": (_count, None),
    "ctx-checkpoints": (_count, None),
    "checkpoint-min-step": (_count, None),
    "cache-reuse": (_count, None),
    "ctx-size": (_count, None),
    "batch-size": (_count, None),
    "ubatch-size": (_count, None),
    "slot-prompt-similarity": (float, None),
    "kv-unified": (_flag, ("kv-unified", "no-kv-unified")),
    "cache-idle-slots": (_flag, ("cache-idle-slots", "no-cache-idle-slots")),
    "cache-prompt": (_flag, ("cache-prompt", "no-cache-prompt")),
    "swa-full": (_flag, ("swa-full", "")),
}
ALIASES = {"np": "parallel", "c": "ctx-size", "cram": "cache-ram", "swa-checkpoints": "ctx-checkpoints"}


@dataclass(frozen=True)
class Tried:
    """One `--try OPTION=V1,V2`."""

    option: str
    values: tuple[OptionValue, ...]


def parse_try(text: str) -> Tried:
    """`OPTION=V1,V2,...` with OPTION one of ``TRIABLE`` (ValueError naming what is wrong)."""
    name, equals, values = text.partition("=")
    name = ALIASES.get(name.strip().lstrip("-"), name.strip().lstrip("-"))
    if not equals or not values.strip():
        raise ValueError(f"--try {text}: expected OPTION=VALUE[,VALUE...], e.g. cache-ram=0,8192")
    if name not in TRIABLE:
        close = difflib.get_close_matches(name, TRIABLE, n=1)
        raise ValueError(f"--try {text}: {name} is not an option the reuse model decides on"
                         + (f" (did you mean {close[0]}?)" if close else "") + f"; try one of {', '.join(TRIABLE)}")
    read, _ = TRIABLE[name]
    parsed = []
    for value in values.split(","):
        try:
            parsed.append(read(value.strip()))
        except ValueError:
            kind = "on or off" if read is _flag else "a whole number" if read is _count else "a number"
            raise ValueError(f"--try {text}: {name}: {value.strip()!r} is not {kind}") from None
    return Tried(name, tuple(dict.fromkeys(parsed)))


@dataclass(frozen=True)
class Combination:
    """One point of the tried options: a variant whose options are the profile's with these set."""

    setting: tuple[tuple[str, OptionValue], ...]  # empty: the profile as it is
    variant: Variant

    @property
    def label(self) -> str:
        if not self.setting:
            return "as it is"
        return " ".join(f"--{name} {_spelled(value)}" for name, value in self.setting)


def _spelled(value: OptionValue) -> str:
    return "on" if value is True else "off" if value is False else f"{value:g}" if isinstance(value, float) else str(value)


def _options(options: dict[str, OptionValue], setting: Sequence[tuple[str, OptionValue]]) -> dict[str, OptionValue]:
    changed = dict(options)
    for name, value in setting:
        _, flags = TRIABLE[name]
        if flags is None:
            if name == "ctx-checkpoints":
                changed.pop("swa-checkpoints", None)  # its old name, which would win
            changed[name] = value
            continue
        on, off = flags
        for flag in (on, off):
            changed.pop(flag, None)
        if value and on:
            changed[on] = True
        elif not value and off:
            changed[off] = True
    return changed


def combinations(variant: Variant, table: Mapping[str, HelpOption], tried: Sequence[Tried]) -> list[Combination]:
    """The profile as it is, then every combination of the tried values, each checked against its binary's --help
    `table` (ValueError naming the option the binary lacks)."""
    found = [Combination((), variant)]
    names = [t.option for t in tried]
    if len(set(names)) != len(names):
        raise ValueError(f"--try names {', '.join(sorted({n for n in names if names.count(n) > 1}))} twice: give "
                         "every value in one --try")
    for values in itertools.product(*(t.values for t in tried)):
        setting = tuple(zip(names, values, strict=True))
        options = _options(variant.options, setting)
        for name in set(options) - set(variant.options) | {n for n in names if n in options}:
            problem = binaries.option_problem(table, name, options[name])
            if problem is not None:
                raise ValueError(f"--try {name}: {problem} ({variant.binary.path})")
        label = ",".join(f"{n}={_spelled(v)}" for n, v in setting)
        found.append(Combination(setting, replace(variant, name=f"{variant.name}+{label}", options=options)))
    return found
