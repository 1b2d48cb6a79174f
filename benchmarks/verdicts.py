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
from reusebench.check.run import checked_option_names

from . import common


def _option_names() -> list[str]:
    """Every option some selected variant checks, from the profile's outline (no binary run at discovery)."""
    names: dict[str, None] = {}
    for variant in common.VARIANTS if common.OUTLINE is not None else ():
        names.update(dict.fromkeys(checked_option_names(common.OUTLINE.settings[variant])))
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
        profile = common.whole_profile()
        for name in common.VARIANTS:
            verdicts = check.check_variant(profile.variant(name))
            print(check.render_table(verdicts), file=sys.stderr)
            codes[name] = check.tracked_codes(verdicts)
        return codes

    def track_verdict_code(self, codes: dict[str, Any], variant: str, option: str) -> float:
        found = codes[variant].get(option)
        if found is None:
            raise RuntimeError(f"reusebench check gave no verdict for {option} in variant {variant}")
        return float(found)
