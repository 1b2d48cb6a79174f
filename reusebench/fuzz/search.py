"""The fuzzer's search: hypothesis draws cases of one family, each is played on a real server
(``fuzz.differential``), and the first case whose counts differ is shrunk to the smallest one that still differs.

Hypothesis replays the smallest failing case last, so the case kept is the one it reports. Shrinking is bounded
(``SHRINK_BUDGET`` cases played); a case that failed once is not played again. Its example database is off: a
case is kept as a file of ours (``tests/data/fuzz/``), and a seed makes a run repeatable.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.errors import Flaky, FlakyFailure

from reusebench.capability.build import Build
from reusebench.fuzz import strategies
from reusebench.fuzz.differential import Outcome, play

SHRINK_BUDGET = 150  # cases played to shrink a difference (a server start each): then the smallest so far is kept


class _Differs(AssertionError):
    pass


def _fail(outcome: Outcome, failing: list[Outcome]) -> None:
    """One place that raises: hypothesis tells failures apart by where they were raised."""
    failing.append(outcome)
    raise _Differs(outcome.difference.describe() if outcome.difference else "")


@dataclass
class Found:
    """What a search of one family found."""

    family: str
    cases: int = 0  # cases played, shrinking included
    generated: int = 0  # cases played before the first difference (all of them when none differed)
    requests: int = 0
    seconds: float = 0.0
    shrunk: Outcome | None = None  # the smallest case that differs; None: no difference
    paths: Counter[str] = field(default_factory=Counter)  # requests by the reuse paths the server's log shows
    defects: Counter[str] = field(default_factory=Counter)  # cases that ended at a known server defect
    outputs: Counter[str] = field(default_factory=Counter)  # reused outputs by verdict (identical, within noise...)
    interrupted: bool = False  # Ctrl-C or SIGTERM ended it: the cases played so far


def search(family: str, build: Build, *, cases: int, seed_value: int, shrink: bool = True, outputs: bool = True,
           model_file: Path | None = None, say: Callable[[str], None] = lambda _m: None) -> Found:
    """Up to `cases` generated cases of `family` on `build`'s server; the first difference shrunk (`shrink`);
    `outputs`: reused outputs compared with no reuse too; `model_file`: a GGUF of the family in place of its tiny
    one (``differential.play``)."""
    found = Found(family)
    started = time.monotonic()
    failing: list[Outcome] = []  # in the order they failed: the last is the one hypothesis replays as the smallest
    known: dict[str, Outcome] = {}  # every failing case by its JSON

    @seed(seed_value)
    @settings(max_examples=cases, database=None, deadline=None, print_blob=False, verbosity=Verbosity.quiet,
              phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(strategies.cases(family, build.help))
    def one(case):  # type: ignore[no-untyped-def]
        key = json.dumps(case.to_json(), sort_keys=True)
        if key in known:  # a case that failed already fails again, without a server: the final replay among them
            _fail(known[key], failing)
        if failing and found.cases - found.generated >= SHRINK_BUDGET:
            return  # shrinking has had its servers: the smallest failing case so far is the one kept
        outcome = play(case, build, outputs=outputs, model_file=model_file)
        found.cases += 1
        found.requests += len(outcome.steps)
        found.paths.update(path for step in outcome.steps for path in step.paths)
        found.outputs.update(step.output for step in outcome.steps if step.output)
        if outcome.defect and not failing:
            found.defects[outcome.defect] += 1
        if not failing:
            found.generated = found.cases
        if found.cases % 25 == 0:
            say(f"fuzz {family}: {found.cases} cases, {found.requests} requests, "
                f"{time.monotonic() - started:.0f} s{', shrinking' if failing else ''}")
        if outcome.difference is not None:
            known[key] = outcome
            _fail(outcome, failing)

    try:
        one()
    except (_Differs, Flaky, FlakyFailure):  # flaky: a case failed, then passed when played again; the last kept
        found.shrunk = failing[-1]
    except KeyboardInterrupt:  # the cases played are kept, and the smallest difference so far
        found.interrupted = True
        found.shrunk = failing[-1] if failing else None
    found.seconds = time.monotonic() - started
    return found
