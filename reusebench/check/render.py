"""`reusebench check` output: what was launched, and one table row per verdict with all its evidence."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from reusebench.capability.build import Build
from reusebench.check.run import launch_args
from reusebench.check.verdicts import OptionVerdict
from reusebench.config.profiles import Variant
from reusebench.llama import binaries

EVIDENCE_WIDTH = 100  # --wide
OPTION_WIDTH, VALUE_WIDTH, VERDICT_WIDTH = 20, 14, 12  # VERDICT_WIDTH: UNSUPPORTED, the longest verdict
BORDERS = 13  # simple_grid's "│ " and " │" around four columns


def render_table(verdicts: Sequence[OptionVerdict], width: int | None = None) -> str:
    """One row per verdict with all its evidence, wrapped to fit `width` columns (None: the evidence 100 wide)."""
    rows = [(v.key, v.value, v.verdict.value, "\n".join(v.evidence)) for v in verdicts]
    if width is None:
        widths = [None, 24, None, EVIDENCE_WIDTH]
    else:
        widths = [OPTION_WIDTH, VALUE_WIDTH, None, width - BORDERS - OPTION_WIDTH - VALUE_WIDTH - VERDICT_WIDTH]
    return tabulate(rows, headers=("option", "value", "verdict", "evidence"), tablefmt="simple_grid",
                    maxcolwidths=widths)


def describe_launch(variant: Variant, build: Build | None) -> dict[str, Any]:
    """What was checked: profile, variant, binary and its build, and the arguments the check adds (none where its
    binary could not run: `build` None)."""
    try:
        version = binaries.version(variant.binary)
    except binaries.BinaryError:  # the verdicts say why it did not run
        version = "unknown"
    return {
        "profile": variant.profile, "variant": variant.name, "model": variant.model_spec,
        "binary": str(variant.binary.path), "build": version,
        "added_args": launch_args(variant, build)[1] if build else [],
    }


def render_report(variant: Variant, build: Build | None, verdicts: Sequence[OptionVerdict],
                  width: int | None = None) -> str:
    launch = describe_launch(variant, build)
    header = (f"{launch['profile']} / {launch['variant']} ({launch['model']}), llama-server build {launch['build']}; "
              f"the check adds {' '.join(launch['added_args']) or 'nothing'}")
    if width is not None:
        header = textwrap.fill(header, width)
    return f"{header}\n{render_table(verdicts, width)}"
