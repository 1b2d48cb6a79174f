"""The machine state beside each first load: was a slow commit slow, or was the GPU hot, throttled or idle?

Report A saw one 128K first load take 17.6 to 24.2 minutes under the same settings and
could not say why. These tracks put the GPU state at the start of (and during) the cold
first load next to its seconds, so a jump in ``FirstLoad.track_prefill_seconds`` can be
read against them. They are context, not figures to improve: asv takes lower as better
for every track, so its "regressed"/"improved" marks on them mean nothing.

Without a GPU (this CPU machine, CI) the GPU fields are null and the tracks are NaN,
which asv shows as n/a; a failed session still fails, as in ``reuse.py``.
With ``REUSEBENCH_ASV_REPEAT`` > 1 every first load runs on a fresh server per repeat,
and ``FirstLoadSpread`` tracks the min/median/max of their seconds.
"""

from asv_runner.benchmarks.mark import SkipNotImplemented

from . import common


def _spread(name):
    """A track of figure `name` over the repeated first loads: n/a (skipped) with one repeat."""
    def read(cache, size, variant, step):
        if common.figure(cache, size, variant, step, "repeats") < 2:
            raise SkipNotImplemented("one first load has no spread: set REUSEBENCH_ASV_REPEAT=3")
        return common.figure(cache, size, variant, step, name)
    return common.track(read, common.FIRST_LOAD)


class FirstLoadGpuState(common.SessionFigures):
    """GPU state of the cold first load (the median over repeats). Context, not a figure to improve."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    version = "2"  # 2: the tracks lost their redundant first_load_ prefix

    track_start_temperature_c = common.track(
        "start_temperature_c", common.FIRST_LOAD, unit="degrees C",
        doc="GPU temperature when the first load began (context: a cool GPU boosts higher).")
    track_sm_clock_mean_mhz = common.track(
        "sm_clock_mean_mhz", common.FIRST_LOAD, unit="MHz",
        doc="Mean SM clock during the first load (context: lower clocks make a slower load).")
    track_throttled_fraction = common.track(
        "throttled_fraction", common.FIRST_LOAD, unit="fraction",
        doc="Fraction of GPU samples during the first load with a throttle reason (lower is better here).")
    track_idle_before_s = common.track(
        "idle_before_s", common.FIRST_LOAD, unit="seconds",
        doc="Seconds the GPU had been idle before the first load (context: a long idle means low clocks at the start).")
    track_model_page_cache_fraction = common.track(
        "model_page_cache_fraction", common.FIRST_LOAD, unit="fraction",
        doc="Fraction of the model file in the page cache before the server started (context: 0 means read from disk).")


class FirstLoadSpread(common.SessionFigures):
    """Min, median and max first-load seconds over REUSEBENCH_ASV_REPEAT fresh servers (n/a with one repeat)."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    unit = "seconds"
    version = "2"  # 2: the tracks lost their redundant first_load_ prefix

    track_min_seconds = _spread("prefill_seconds_min")
    track_median_seconds = _spread("prefill_seconds")
    track_max_seconds = _spread("prefill_seconds_max")


class MachineBusy(common.SessionFigures):
    """1 where other work loaded the machine before the step (a 1-minute load average above one task per core plus
    0.5), else 0: that step's seconds are noise, and `reusebench compare` does not judge them. Context, not a figure
    to improve."""

    params = (common.SIZES, common.VARIANTS, [common.FIRST_LOAD, *common.REUSE_STEPS])
    param_names = ["size", "variant", "step"]
    unit = "flag"
    version = "1"

    track_busy = common.track("busy")
