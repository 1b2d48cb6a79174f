"""The users of a workload, drawn once from its seed, and what each of their turns can hope for.

Every draw (who carries a LoRA, arrival times, think times, which turns are
regenerated) is made here, before the server starts, so the same workload file
gives the same users. A turn's kind says whether any cache could serve it:

- ``first``: a conversation's first turn (nothing of it was ever computed);
- ``head insert``: a summary inserted at the head, so every token after the system prompt changes;
- ``after sleep``: the first turn after the server slept (it dropped every slot and its RAM cache);
- ``continues``: the previous prompt, the answer, a new question: should hit;
- ``regenerate``: the same turn sent again: should hit.

The tap (``reusebench.tap``) classes real traffic in the same words, and in three more a workload never sends:
``retry`` (a turn sent again after its call failed) and ``after a gap`` (a turn after the conversation was idle
for a long time, with no sleep between) should hit; ``edit`` (the prompt parts from what the conversation sent
before, inside it) cannot.

``User.kinds`` is the workload's structure: what each turn sends. A turn after an idle gap is sent as
drawn, and is ``after sleep`` when the server slept in the gap (``planned_kinds``: when every gap ends in
a sleep); the driver labels it from the sleep it saw, as it does a later turn of a user the gap did not wait
for. A user's first turn is ``first`` whenever it comes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reusebench.config.workload import Workload
from reusebench.llama.facts import NO_LORA

FIRST, CONTINUES, REGENERATE, HEAD_INSERT, AFTER_SLEEP = "first", "continues", "regenerate", "head insert", "after sleep"
RETRY, AFTER_GAP, EDIT = "retry", "after a gap", "edit"
CANNOT_HIT = (FIRST, HEAD_INSERT, AFTER_SLEEP, EDIT)
SHOULD_HIT = (CONTINUES, REGENERATE, RETRY, AFTER_GAP)
WORKLOAD_KINDS = (FIRST, CONTINUES, REGENERATE, HEAD_INSERT, AFTER_SLEEP)  # what a workload's turns can be
HEALTH_CHECK = "health check"
UNRELATED = "unrelated"  # the tap's word for a short request that continues no conversation (a health check)


@dataclass(frozen=True)
class User:
    name: str  # "<group>-<n>"
    group: str
    number: int  # across the workload: picks the user's text
    opening_tokens: int
    lora: list[dict[str, float]] | None  # None: no adapter (sent as NO_LORA)
    arrival_s: float
    think_s: tuple[float, ...]  # before turns 2..n
    kinds: tuple[str, ...]  # the structural kind of turns 1..n: what each sends

    @property
    def turns(self) -> int:
        return len(self.kinds)

    @property
    def request_lora(self) -> list[dict[str, float]]:
        return self.lora if self.lora is not None else NO_LORA


def draw_users(workload: Workload) -> list[User]:
    """The workload's users in arrival order, every random choice taken from its seed."""
    rng = random.Random(workload.seed)
    users: list[User] = []
    arrival = 0.0
    for group in workload.groups:
        with_lora = round(group.count * group.lora.share) if group.lora else 0
        for index in range(group.count):
            lora = [{"id": group.lora.adapter, "scale": group.lora.scale}] if group.lora and index < with_lora else None
            users.append(User(
                name=f"{group.name}-{index + 1}", group=group.name, number=len(users),
                opening_tokens=group.opening_tokens, lora=lora, arrival_s=arrival,
                think_s=tuple(rng.uniform(*workload.think_time_s) for _ in range(group.turns - 1)),
                kinds=structural_kinds(workload, group.turns, rng),
            ))
            arrival += _arrival_gap(workload, rng)
    return users


def planned_kinds(workload: Workload, user: User) -> tuple[str, ...]:
    """The kind of each of the user's turns when every idle gap ends in a sleep."""
    kinds = list(user.kinds)
    for gap in workload.idle_gaps_after_turn:
        if gap < user.turns:
            kinds[gap] = AFTER_SLEEP  # turn gap + 1
    return tuple(kinds)


def _arrival_gap(workload: Workload, rng: random.Random) -> float:
    if workload.arrival == "staggered":
        return workload.arrival_gap_s
    if workload.arrival == "poisson":
        return rng.expovariate(1.0 / workload.arrival_gap_s)
    return 0.0


def structural_kinds(workload: Workload, turns: int, rng: random.Random) -> tuple[str, ...]:
    kinds = [FIRST]
    for turn in range(2, turns + 1):
        every = workload.head_insert_every
        if every is not None and (turn - 1) % every == 0:
            kinds.append(HEAD_INSERT)
        elif rng.random() < workload.regenerate_share:
            kinds.append(REGENERATE)
        else:
            kinds.append(CONTINUES)
    return tuple(kinds)
