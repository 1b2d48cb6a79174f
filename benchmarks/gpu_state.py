"""The machine state beside each first load: was a slow commit slow, or was the GPU hot, throttled or idle?

Report A saw one 128K first load take 17.6 to 24.2 minutes under the same settings and
could not say why. These tracks put the GPU state at the start of (and during) the cold
first load next to its seconds, so a jump in ``FirstLoad.track_prompt_seconds`` can be
read against them. They are context, not figures to improve: asv takes lower as better
for every track, so its "regressed"/"improved" marks on them mean nothing.

Without a GPU (this CPU machine, CI) the GPU fields are null and the tracks are NaN,
which asv shows as n/a; a failed session still fails, as in ``reuse.py``.
With ``REUSEBENCH_ASV_REPEAT`` > 1 every first load runs on a fresh server per repeat,
and ``FirstLoadSpread`` tracks the min/median/max of their seconds.
"""

from asv_runner.benchmarks.mark import SkipNotImplemented

from . import common

FIRST_LOAD = "first_load/cold"


class FirstLoadGpuState(common.SessionFigures):
    """GPU state of the cold first load (the median over repeats). Context, not a figure to improve."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    version = "1"

    def track_first_load_start_temperature_c(self, cache, size, variant):
        """GPU temperature when the first load began (context: a cool GPU boosts higher)."""
        return common.figure(cache, size, variant, FIRST_LOAD, "start_temperature_c")

    track_first_load_start_temperature_c.unit = "degrees C"

    def track_first_load_sm_clock_mean_mhz(self, cache, size, variant):
        """Mean SM clock during the first load (context: lower clocks make a slower load)."""
        return common.figure(cache, size, variant, FIRST_LOAD, "sm_clock_mean_mhz")

    track_first_load_sm_clock_mean_mhz.unit = "MHz"

    def track_first_load_throttled_fraction(self, cache, size, variant):
        """Fraction of GPU samples during the first load with a throttle reason (lower is better here)."""
        return common.figure(cache, size, variant, FIRST_LOAD, "throttled_fraction")

    track_first_load_throttled_fraction.unit = "fraction"

    def track_first_load_idle_before_s(self, cache, size, variant):
        """Seconds the GPU had been idle before the first load (context: a long idle means low clocks at the start)."""
        return common.figure(cache, size, variant, FIRST_LOAD, "idle_before_s")

    track_first_load_idle_before_s.unit = "seconds"

    def track_first_load_model_page_cache_fraction(self, cache, size, variant):
        """Fraction of the model file in the page cache before the server started (context: 0 means read from disk)."""
        return common.figure(cache, size, variant, FIRST_LOAD, "model_page_cache_fraction")

    track_first_load_model_page_cache_fraction.unit = "fraction"


class FirstLoadSpread(common.SessionFigures):
    """Min, median and max first-load seconds over REUSEBENCH_ASV_REPEAT fresh servers (n/a with one repeat)."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    unit = "seconds"
    version = "1"

    def track_first_load_min_seconds(self, cache, size, variant):
        return _spread(cache, size, variant, "prompt_seconds_min")

    def track_first_load_median_seconds(self, cache, size, variant):
        return _spread(cache, size, variant, "prompt_seconds")

    def track_first_load_max_seconds(self, cache, size, variant):
        return _spread(cache, size, variant, "prompt_seconds_max")


def _spread(cache, size, variant, name):
    if common.figure(cache, size, variant, FIRST_LOAD, "repeats") < 2:
        raise SkipNotImplemented("one first load has no spread: set REUSEBENCH_ASV_REPEAT=3")
    return common.figure(cache, size, variant, FIRST_LOAD, name)
