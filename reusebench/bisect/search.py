"""The search: between a good and a bad build, the first build where each figure that differs between them
changed, measuring as few builds as it can.

Every figure is searched over the same measurements: a build measured for one figure narrows every other. For
a figure, the last build that held is the newest measured build older than every measured build where it
changed, with the good build's value; the first changed is the oldest measured build where it differs. The
search measures the middle build between them until they are neighbours (skipping builds that cannot be
measured), about log2(n) builds for one change. A figure that changed and changed back between two measured
builds is not seen: the search finds where it moved between the builds it measured, as `git bisect` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reusebench.bisect.builds import Point
from reusebench.bisect.figures import FigureKey, Measurement


class BisectError(Exception):
    """The good or the bad build gives no figures: nothing to search between."""


@dataclass(frozen=True)
class Change:
    """Where one figure changed: the last build with the good build's value and the first without it."""

    key: FigureKey
    held: Point
    held_value: int | None
    changed: Point
    changed_value: int | None
    skipped: tuple[Point, ...]  # builds between the two that could not be measured: the change is in one of them
    # too, or in `changed`


class Search:
    """Measures builds on demand (each once) and finds every change between the first and last of `points`."""

    def __init__(self, points: Sequence[Point], measure: Callable[[Point], Measurement]):
        if len(points) < 2:
            raise BisectError("a bisect needs two builds, a good and a bad one")
        self.points = list(points)
        self._measure = measure
        self.measured: dict[int, Measurement] = {}

    def measurement(self, index: int) -> Measurement:
        if index not in self.measured:
            self.measured[index] = self._measure(self.points[index])
        return self.measured[index]

    def differing(self) -> list[FigureKey]:
        """The figures the good and the bad build disagree on (both builds measured first)."""
        good, bad = self.measurement(0), self.measurement(len(self.points) - 1)
        for name, end in (("good", good), ("bad", bad)):
            if end.failed:
                raise BisectError(f"the {name} build gives no figures: {end.failed}")
        keys = sorted(set(good.figures) | set(bad.figures))
        return [key for key in keys if good.figures.get(key) != bad.figures.get(key)]

    def find(self, key: FigureKey) -> Change:
        """The change of `key`, measuring builds until the last held and the first changed are neighbours."""
        start = self.measurement(0).figures.get(key)
        while True:
            held, changed = self._bounds(key, start)
            between = [i for i in range(held + 1, changed) if not self._failed(i)]
            unmeasured = [i for i in between if i not in self.measured]
            if not unmeasured:
                skipped = tuple(self.points[i] for i in range(held + 1, changed) if self._failed(i))
                return Change(key, self.points[held], start, self.points[changed],
                              self.measured[changed].figures.get(key), skipped)
            middle = (held + changed) / 2
            self.measurement(min(unmeasured, key=lambda i: (abs(i - middle), i)))

    def _bounds(self, key: FigureKey, start: int | None) -> tuple[int, int]:
        usable = {i: m.figures.get(key) for i, m in self.measured.items() if not m.failed}
        changed = min(i for i, value in usable.items() if value != start)
        held = max(i for i, value in usable.items() if i < changed and value == start)
        return held, changed

    def _failed(self, index: int) -> bool:
        return index in self.measured and self.measured[index].failed is not None
