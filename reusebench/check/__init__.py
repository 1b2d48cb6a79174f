"""`reusebench check`: is each option really in effect? A verdict with evidence for every option a variant sets.

For each option the profile sets, and for the defaults that decide prompt reuse, one small probe
(``probes.PROBES``) gives a verdict:

- ACTIVE: the feature is on and a probe showed it working (or, for sizes and counts,
  the server reported the value it applied);
- DISABLED: the feature is off: the server said so (the line is quoted with its
  level, or an HTTP error), or the value turns it off and the probe saw no effect;
- INEFFECTIVE: accepted and on, but without a measurable effect;
- UNSAFE: in effect, but reused output is not what a computation without reuse gives
  beyond the noise of batch shapes (``verification.judge``);
- UNSUPPORTED: this binary's ``--help`` does not accept it (``binaries.option_problem``; found before any launch);
- UNVERIFIED: no probe exists, or the probe could not decide; the evidence says why.

Modules: ``verdicts`` (the verdict types and asv codes), ``context`` (what probes share on one running
server), ``probes`` (one function per option), ``run`` (what to check, the launch, the run),
``render`` (the table and report).
"""

from reusebench.check.render import describe_launch, render_report, render_table
from reusebench.check.run import INTERRUPTED, CheckInterrupted, check_variant
from reusebench.check.verdicts import (
    FAILING_VERDICTS,
    STRICT_FAILING_VERDICTS,
    VERDICT_CODES,
    OptionVerdict,
    Setting,
    Verdict,
    tracked_codes,
)

__all__ = [
    "CheckInterrupted",
    "FAILING_VERDICTS",
    "INTERRUPTED",
    "STRICT_FAILING_VERDICTS",
    "VERDICT_CODES",
    "OptionVerdict",
    "Setting",
    "Verdict",
    "check_variant",
    "describe_launch",
    "render_report",
    "render_table",
    "tracked_codes",
]
