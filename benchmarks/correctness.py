"""Correctness of reused output: does a reused prompt give the output computed without reuse?

Each reuse step is compared with a reference request sent with ``cache_prompt:
false``, teacher-forced, against the noise band that a change of batch shape alone
causes on the same model and build (``reusebench.reuse.verification``). A correct
server scores 0.
"""

from . import common


class ReusedOutputMismatch(common.SessionFigures):
    """1 when the reused output differed from the no-reuse reference, else 0."""

    params = (common.SIZES, common.VARIANTS, common.REUSE_STEPS)
    param_names = ["size", "variant", "step"]
    unit = "mismatches"
    version = "1"

    track_mismatch = common.track("mismatch")
