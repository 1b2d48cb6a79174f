"""`reusebench nightly`: asv over the llama.cpp commits not measured yet, one results directory, one lock."""

from reusebench.nightly.commits import NightlyError
from reusebench.nightly.config import CHECKOUT, CONFIG_FILE, NightlyConfig, commit_of, derive
from reusebench.nightly.lock import NightlyBusy
from reusebench.nightly.night import AsvFailed, Night, NightOptions, publish, run_night

__all__ = ["CHECKOUT", "CONFIG_FILE", "AsvFailed", "Night", "NightOptions", "NightlyBusy", "NightlyConfig", "NightlyError",
           "commit_of", "derive", "publish", "run_night"]
