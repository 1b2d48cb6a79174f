"""Is each option really in effect? The verdicts of ``reusebench check`` as tracked numbers.

A commit that silently disables an option (or makes it unsafe) changes its number
in the web UI. The numbers are codes, not amounts: 0 UNVERIFIED, 1 ACTIVE,
2 DISABLED, 3 INEFFECTIVE, 4 UNSAFE, 5 UNSUPPORTED (``reusebench.check.VERDICT_CODES``).
An option judged in several aspects (slot-save-path: resend, re-ask, extension after
a restart) tracks its highest code, the most severe; ``reusebench check`` lists each.
"""

from __future__ import annotations

import sys
from typing import Any

from reusebench import check
from reusebench.check.run import settings_to_check

from . import common


def _option_names() -> list[str]:
    names: dict[str, None] = {}
    for variant in common.VARIANTS:
        for setting, _probe in settings_to_check(common.PROFILE.variant(variant)):
            names.setdefault(setting.option)
    return list(names)


class OptionVerdict:
    """Verdict code of each option the profile sets and of each reuse default, per variant."""

    params = (common.VARIANTS, _option_names())
    param_names = ["variant", "option"]
    unit = "verdict code"
    version = "1"
    timeout = 1800  # one short probe server per variant: seconds, not minutes

    def setup_cache(self) -> dict[str, dict[str, int]]:
        codes: dict[str, dict[str, int]] = {}
        for name in common.VARIANTS:
            verdicts = check.check_variant(common.PROFILE.variant(name))
            print(check.render_table(verdicts), file=sys.stderr)
            by_option: dict[str, int] = {}
            for verdict in verdicts:
                by_option[verdict.option] = max(by_option.get(verdict.option, 0), verdict.code)
            codes[name] = by_option
        return codes

    def track_verdict_code(self, codes: dict[str, Any], variant: str, option: str) -> float:
        found = codes[variant].get(option)
        if found is None:
            raise RuntimeError(f"reusebench check gave no verdict for {option} in variant {variant}")
        return float(found)
