"""`reusebench bisect`: the first llama.cpp build whose count changed, between a good and a bad one.

Data flows one way: the builds to search (`builds`: published trees or a clone's commits) -> one measurement
per build (`figures`: a profile's run, its counts) -> the search (`search`: fewest builds measured) -> the
change, with the commits between the two builds where a clone has them.
"""

from reusebench.bisect.builds import Builds, CloneBuilds, Point, PublishedBuilds
from reusebench.bisect.figures import FigureKey, Measurement, Probe, measure, measure_build
from reusebench.bisect.search import BisectError, Change, Search

__all__ = ["BisectError", "Builds", "Change", "CloneBuilds", "FigureKey", "Measurement", "Point", "Probe", "PublishedBuilds",
           "Search", "measure", "measure_build"]
