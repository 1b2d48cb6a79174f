"""What the asv suite measures per commit, from its REUSEBENCH_ASV_* variables: read in one place, for the suite
(benchmarks/common.py) and for the nightly's plan (reusebench.nightly), which must agree on it.

asv has no other way to pass settings to benchmarks. Lists are separated by spaces, as everywhere in reusebench's
environment (a variant's name holds commas: "mmproj=on,cache-reuse=256").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reusebench.config import profiles, scenarios, sizes

DEFAULT_SIZES = "32K 128K"
DEFAULT_PROFILE = "tiny-qwen35"
BUILT_PROFILE = "nightly-tiny-qwen35"  # takes its binary from ${REUSEBENCH_LLAMA_SERVER}
BUILT_ENV = "ASV_ENV_DIR"  # only environments asv builds set it: the nightly over llama.cpp commits


class SelectionError(ValueError):
    """A REUSEBENCH_ASV_* variable that names nothing the suite has; the message names the variable."""


@dataclass(frozen=True)
class Selection:
    """The profile, sizes, variants and scenarios the suite runs, with its repeats and early stop."""

    profile: str
    sizes: tuple[int, ...]
    variants: tuple[str, ...]
    scenarios: tuple[str, ...]
    repeat: int
    full_prefills: bool

    @property
    def size_labels(self) -> list[str]:
        """The sizes as asv's parameter values: "32K", "128K"."""
        return [sizes.size_label(tokens) for tokens in self.sizes]


def words(environ: Mapping[str, str], name: str, default: str, commas: bool = False) -> list[str]:
    """A space-separated list; a comma where names cannot hold one is refused (the one list style)."""
    text = environ.get(name, default)
    if not commas and "," in text:
        raise SelectionError(f"{name}: separate the names with spaces, not commas: {text!r}")
    return text.split()


def profile_name(environ: Mapping[str, str]) -> str:
    """Where asv built the environment, the profile runs the llama-server asv built."""
    return environ.get("REUSEBENCH_ASV_PROFILE", BUILT_PROFILE if BUILT_ENV in environ else DEFAULT_PROFILE)


def from_env(environ: Mapping[str, str] | None = None) -> Selection:
    """The selection the variables make, checked against the profile's outline (its files only: cheap at import)."""
    environ = os.environ if environ is None else environ
    name = profile_name(environ)
    outline = profiles.outline(name)
    try:
        chosen_sizes = tuple(sizes.parse_size(word) for word in words(environ, "REUSEBENCH_ASV_SIZES", DEFAULT_SIZES))
    except sizes.SizeError as error:
        raise SelectionError(f"REUSEBENCH_ASV_SIZES: {error}") from None
    variants = tuple(words(environ, "REUSEBENCH_ASV_VARIANTS", " ".join(outline.variants), commas=True))
    unknown = [variant for variant in variants if variant not in outline.variants]
    if unknown:
        raise SelectionError(f"REUSEBENCH_ASV_VARIANTS: {outline.name} has no variant {', '.join(map(repr, unknown))}; "
                             f"valid variants: {', '.join(outline.variants)}")
    chosen = tuple(words(environ, "REUSEBENCH_ASV_SCENARIOS", " ".join(scenarios.SCENARIO_IDS)))
    unknown = [scenario for scenario in chosen if scenario not in scenarios.SCENARIO_IDS]
    if unknown:
        raise SelectionError(f"REUSEBENCH_ASV_SCENARIOS: no scenario {', '.join(map(repr, unknown))}; valid: "
                             f"{' '.join(scenarios.SCENARIO_IDS)}")
    repeat = environ.get("REUSEBENCH_ASV_REPEAT", "1")
    if not repeat.isdigit() or int(repeat) < 1:
        raise SelectionError(f"REUSEBENCH_ASV_REPEAT: expected a whole number of sessions, 1 or more, got {repeat!r}")
    full = environ.get("REUSEBENCH_ASV_FULL_PREFILLS", "0")
    if full not in ("0", "1"):
        raise SelectionError(f"REUSEBENCH_ASV_FULL_PREFILLS: expected 0 or 1, got {full!r}")
    return Selection(name, chosen_sizes, variants, chosen, int(repeat), full == "1")


def records_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """REUSEBENCH_ASV_RECORDS: a `reusebench run`'s records.jsonl that the suite publishes instead of measuring
    again (`make bench`), else None."""
    environ = os.environ if environ is None else environ
    named = environ.get("REUSEBENCH_ASV_RECORDS")
    return Path(named) if named else None


@dataclass(frozen=True)
class Services:
    """What the service and trace benchmarks run: a workload's counts, the interference workload's timings and its
    runs, a trace's first requests on a profile (an empty name: that benchmark runs nothing, n/a)."""

    workload: str
    interference: str
    interference_repeat: int
    trace: str
    trace_profile: str
    trace_requests: int


def _whole(environ: Mapping[str, str], name: str, default: str, what: str) -> int:
    text = environ.get(name, default)
    if not text.isdigit() or int(text) < 1:
        raise SelectionError(f"{name}: expected a whole number of {what}, 1 or more, got {text!r}")
    return int(text)


def services_from_env(environ: Mapping[str, str] | None = None) -> Services:
    """The service and trace benchmarks' selection from REUSEBENCH_ASV_WORKLOAD, _INTERFERENCE, _INTERFERENCE_REPEAT,
    _TRACE, _TRACE_PROFILE and _TRACE_REQUESTS."""
    environ = os.environ if environ is None else environ
    return Services(environ.get("REUSEBENCH_ASV_WORKLOAD", "report-b-service"),
                    environ.get("REUSEBENCH_ASV_INTERFERENCE", "interference"),
                    _whole(environ, "REUSEBENCH_ASV_INTERFERENCE_REPEAT", "3", "runs"),
                    environ.get("REUSEBENCH_ASV_TRACE", "mooncake-conversation"),
                    environ.get("REUSEBENCH_ASV_TRACE_PROFILE", "tiny-qwen35"),
                    _whole(environ, "REUSEBENCH_ASV_TRACE_REQUESTS", "300", "requests"))
