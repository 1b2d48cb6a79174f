"""`reusebench check` output: what was launched, and one table row per verdict with all its evidence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from reusebench.check.run import launch_args
from reusebench.check.verdicts import OptionVerdict
from reusebench.config.profiles import Variant
from reusebench.llama import binaries

EVIDENCE_WIDTH = 100


def render_table(verdicts: Sequence[OptionVerdict]) -> str:
    rows = [(v.key, v.value, v.verdict.value, "\n".join(v.evidence)) for v in verdicts]
    return tabulate(rows, headers=("option", "value", "verdict", "evidence"), tablefmt="simple_grid",
                    maxcolwidths=[None, 24, None, EVIDENCE_WIDTH])


def describe_launch(variant: Variant) -> dict[str, Any]:
    """What was checked: profile, variant, binary and its build, and the arguments the check adds."""
    try:
        build = binaries.version(variant.binary)
    except binaries.BinaryError:  # the verdicts say why it did not run
        build = "unknown"
    return {
        "profile": variant.profile, "variant": variant.name, "model": variant.model_spec,
        "binary": str(variant.binary.path), "build": build,
        "added_args": launch_args(variant)[1],
    }


def render_report(variant: Variant, verdicts: Sequence[OptionVerdict]) -> str:
    launch = describe_launch(variant)
    header = (f"{launch['profile']} / {launch['variant']} ({launch['model']}), llama-server build {launch['build']}; "
              f"the check adds {' '.join(launch['added_args']) or 'nothing'}")
    return f"{header}\n{render_table(verdicts)}"
