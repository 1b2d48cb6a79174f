"""The serial schedule: every request of a workload in one fixed order, made before the server starts.

Which slot a turn lands in, what the RAM cache holds and what LRU evicts depend on the order in which requests
reach the server, on which of them are in flight at each launch, and on the order in which earlier ones ended.
The schedule fixes all three: requests go one at a time, in the order they would start if every request took no
time. The workload's times keep their meaning as an order, not as waits:

- a user's first turn comes at its arrival, each later one its think time after the one before;
- the health check comes every ``period_s``, from ``period_s`` until the users' last turn;
- an idle gap after turn T comes once every user with more than T turns has had turn T; their turns after it
  start from there; whatever else comes later than the gap (another user's turn, a probe) comes after it.

Ties go to turns before probes, then to the earlier user, so the order depends on the workload file alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from reusebench.config.users import User
from reusebench.config.workload import Workload


class StepKind(IntEnum):  # the order among steps at one moment: turns, then probes; a gap opens its phase
    GAP = -1
    TURN = 0
    PROBE = 1


@dataclass(frozen=True)
class Step:
    kind: StepKind
    at_s: float  # when it comes in the workload's time (requests taking none)
    user: User | None = None  # TURN
    number: int = 0  # TURN: the user's turn (1-based); PROBE: the probe's number; GAP: its index

    @property
    def is_gap(self) -> bool:
        return self.kind == StepKind.GAP


@dataclass(frozen=True)
class Times:
    turns: dict[str, list[float]]  # each user's turn times
    gaps: list[tuple[int, float]]  # each idle gap that holds a user back: the turn it comes after, its time


def times(workload: Workload, drawn: list[User]) -> Times:
    """Each user's turn times and each idle gap's time: a gap holds back the turns after it of the users it
    waits for, which then go on from the gap's time."""
    turns = {}
    for user in drawn:
        at = [user.arrival_s]
        for think in user.think_s:
            at.append(at[-1] + think)
        turns[user.name] = at
    gaps = []
    for after in workload.idle_gaps_after_turn:
        waiting = [u for u in drawn if u.turns > after]
        if not waiting:
            continue
        gap = max(turns[u.name][after - 1] for u in waiting)
        for user in waiting:
            at = turns[user.name]
            at[after] = gap + user.think_s[after - 1]
            for turn in range(after + 1, user.turns):
                at[turn] = at[turn - 1] + user.think_s[turn - 1]
        gaps.append((after, gap))
    return Times(turns, gaps)


def serial_schedule(workload: Workload, drawn: list[User]) -> list[Step]:
    """Every step of the workload in the order they are sent (``cut`` applies the request bound)."""
    found = times(workload, drawn)

    def phase(at_s: float, user: User | None = None, turn: int = 0) -> int:
        """How many idle gaps come before this step: by turn for the users a gap waits for, else by time."""
        return sum((turn > after) if user is not None and user.turns > after else (at_s > gap)
                   for after, gap in found.gaps)

    keyed = []
    for user in drawn:
        for turn, at in enumerate(found.turns[user.name], start=1):
            key = (phase(at, user, turn), at, StepKind.TURN, user.number, turn)
            keyed.append((key, Step(StepKind.TURN, at, user, turn)))
    check = workload.health_check
    if check is not None:
        last = max(at for at_user in found.turns.values() for at in at_user)
        number = 1
        while number * check.period_s <= last:
            at = number * check.period_s
            keyed.append(((phase(at), at, StepKind.PROBE, 0, number), Step(StepKind.PROBE, at, None, number)))
            number += 1
    for index, (_, gap) in enumerate(found.gaps):
        keyed.append(((index + 1, float("-inf"), StepKind.GAP, 0, 0), Step(StepKind.GAP, gap, None, index)))
    return [step for _, step in sorted(keyed, key=lambda pair: pair[0])]


def cut(steps: list[Step], max_requests: int) -> list[Step]:
    """The steps up to the `max_requests`-th request, without a gap at the end."""
    kept, requests = [], 0
    for step in steps:
        if requests == max_requests:
            break
        kept.append(step)
        requests += not step.is_gap
    while kept and kept[-1].is_gap:
        kept.pop()
    return kept


def requests_in(steps: list[Step]) -> int:
    return sum(not step.is_gap for step in steps)
