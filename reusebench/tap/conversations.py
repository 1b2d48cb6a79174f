"""Which conversation a request continues, and how: its class, turn, ideal and divergence point, from token ids.

The ids stay in memory: each live conversation's last prompt and its answer, dropped once it has been idle for
``forget_after_s`` (or the tap stops), and the oldest first beyond ``max_tokens`` held (counted in ``dropped``);
the perfect cache goes too once no conversation is left, and at stop. Against them a request is, in this order:

- ``regenerate``: the conversation's last prompt again (``retry`` when that call failed);
- ``continues``: it extends the conversation's last prompt (the answer and a new question, as a chat client
  sends), or ``after a gap`` when the conversation was idle for at least ``gap_s``;
- ``head insert``: what the conversation sent after their shared opening comes back later in this prompt,
  behind inserted tokens (a summary at the head): everything after the insert shifts, which a chained block hash
  could not recognise;
- ``edit``: it parts from the conversation inside what the conversation sent, past their shared opening;
- ``unrelated``: a short request (at most ``probe_tokens``) that matches no conversation, as a health check is;
  it is recorded as a probe and starts no conversation;
- ``first``: anything else, which starts a conversation.

A continuing turn is ``after sleep`` instead when the server slept since the conversation's last turn (the
driver counts the sleeps in the server's log). The ideal is a perfect cache's (``reuse.perfect_cache``); the
divergence point is where the prompt parts from the longest sequence seen before.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from reusebench.config import users
from reusebench.llama.outputs import common_prefix
from reusebench.records import Role
from reusebench.reuse.perfect_cache import PerfectCache

MIN_HEAD_TAIL = 16  # tokens of a conversation's history that must reappear for a head insert (no chance match)
DEFAULT_PROBE_TOKENS = 32
DEFAULT_GAP_S = 600.0
DEFAULT_FORGET_AFTER_S = 6 * 3600.0
MAX_CONVERSATIONS = 10_000
MAX_HELD_TOKENS = 8_000_000  # 32 MB of int32 ids over the live conversations' last prompts


@dataclass
class Conversation:
    name: str  # "conv-1", in the order they started
    turns: int
    prompt: np.ndarray  # the last prompt sent
    last_seen: float  # monotonic seconds: when its last call ended (or was sent, while in flight)
    sleeps: int  # the server's sleeps counted when its last turn was sent
    failed: bool = False  # its last call failed or was cut off
    unseen_answer: int | None = None  # tokens of its last answer, when the answer carried no ids


@dataclass(frozen=True)
class Classed:
    """What the tap records of one request's place among the conversations."""

    kind: str  # users.FIRST, ..., users.UNRELATED
    role: Role  # MEASURE for a conversation's turn, PROBE for an unrelated request
    user: str  # the conversation, or users.UNRELATED
    turn: int  # the conversation's turn, from 1; an unrelated request's number
    ideal: int
    divergence: int  # tokens shared with the longest sequence seen before
    gap_s: float | None  # since the conversation's last call ended
    inserted: int | None = None  # a head insert's inserted tokens

    @property
    def expected_hit(self) -> bool:
        return self.kind in users.SHOULD_HIT


@dataclass(frozen=True)
class Ticket:
    """A classed request in flight: ``Conversations.ended`` closes it."""

    classed: Classed
    prompt: np.ndarray
    conversation: Conversation | None


def _find(haystack: np.ndarray, needle: np.ndarray, start: int) -> int:
    """The first position >= `start` where `needle` occurs in `haystack`, or -1 (byte search, id-aligned)."""
    hay, pin, width = haystack.tobytes(), needle.tobytes(), haystack.itemsize
    at = hay.find(pin, start * width)
    while at >= 0 and at % width:
        at = hay.find(pin, at + 1)
    return -1 if at < 0 else at // width


class Conversations:
    """The live conversations of one tap; thread-safe."""

    def __init__(self, *, probe_tokens: int = DEFAULT_PROBE_TOKENS, gap_s: float = DEFAULT_GAP_S,
                 forget_after_s: float = DEFAULT_FORGET_AFTER_S, seen: PerfectCache | None = None,
                 max_tokens: int = MAX_HELD_TOKENS) -> None:
        self.probe_tokens, self.gap_s, self.forget_after_s = probe_tokens, gap_s, forget_after_s
        self.max_tokens = max_tokens
        self.dropped = 0  # conversations dropped for the bounds (not for idling)
        self.seen = seen or PerfectCache()
        self._live: list[Conversation] = []
        self._started = 0  # conversations ever started: names them
        self._unrelated = 0  # unrelated requests: numbers them
        self._openings: list[np.ndarray] = []  # the first prompts, for the opening they all share (bounded)
        self._lock = threading.Lock()

    def classify(self, prompt: list[int], *, sleeps: int, now: float) -> Ticket:
        ids = np.asarray(prompt, dtype=np.int32)
        with self._lock:
            self._forget(now)
            kind, conversation, inserted = self._place(ids, now)
            if (conversation is not None and conversation.unseen_answer and len(ids) > len(conversation.prompt)
                    and common_prefix(ids, conversation.prompt) == len(conversation.prompt)):
                # it extends the last prompt: the answer's ids come back in it right after that prompt
                self.seen.add(ids[: len(conversation.prompt) + conversation.unseen_answer])
            if conversation is not None:
                conversation.unseen_answer = None
            if conversation is not None and kind != users.FIRST and conversation.sleeps != sleeps:
                kind = users.AFTER_SLEEP
            divergence = self.seen.longest_prefix(ids)
            ideal = max(1, len(ids) - divergence)
            gap = None
            if kind == users.UNRELATED:
                self._unrelated += 1
                return Ticket(Classed(kind, Role.PROBE, users.UNRELATED, self._unrelated, ideal, divergence, None),
                              ids, None)
            if kind == users.FIRST:
                self._started += 1
                conversation = Conversation(f"conv-{self._started}", 0, ids, now, sleeps)
                self._live.append(conversation)
                if len(self._openings) < 64:
                    self._openings.append(ids)
            else:
                assert conversation is not None
                gap = now - conversation.last_seen
            conversation.turns += 1
            conversation.prompt, conversation.failed = ids, False
            conversation.last_seen, conversation.sleeps = now, sleeps
            classed = Classed(kind, Role.MEASURE, conversation.name, conversation.turns, ideal, divergence, gap,
                              inserted)
            return Ticket(classed, ids, conversation)

    def _place(self, ids: np.ndarray, now: float) -> tuple[str, Conversation | None, int | None]:
        best: tuple[int, Conversation] | None = None  # the longest earlier prompt this one extends
        parted: tuple[int, Conversation] | None = None  # the longest shared prefix, for an edit
        for c in self._live:
            shared = common_prefix(ids, c.prompt)
            if shared == len(c.prompt):
                if shared == len(ids):
                    return (users.RETRY if c.failed else users.REGENERATE), c, None
                if best is None or shared > best[0]:
                    best = (shared, c)
            elif parted is None or shared > parted[0]:
                parted = (shared, c)
        if best is not None:
            idle = now - best[1].last_seen
            return (users.AFTER_GAP if idle >= self.gap_s else users.CONTINUES), best[1], None
        head = self._head_insert(ids)
        if head is not None:
            return users.HEAD_INSERT, head[0], head[1]
        opening = self.shared_opening()  # unknown (0) until two conversations started: no edit is told till then
        if parted is not None and opening and parted[0] >= opening + MIN_HEAD_TAIL:
            return users.EDIT, parted[1], None
        if len(ids) <= self.probe_tokens:
            return users.UNRELATED, None, None
        return users.FIRST, None, None

    def _head_insert(self, ids: np.ndarray) -> tuple[Conversation, int] | None:
        """The conversation whose history (past the opening it shares with this prompt) reappears further on in it,
        with the tokens inserted before it; the longest history wins."""
        found: tuple[int, Conversation, int] | None = None
        for c in self._live:
            head = common_prefix(ids, c.prompt)
            tail = c.prompt[head:]
            if len(tail) < MIN_HEAD_TAIL or (found is not None and len(tail) <= found[0]):
                continue
            at = _find(ids, tail, head + 1)
            if at > head:
                found = (len(tail), c, at - head)
        return None if found is None else (found[1], found[2])

    def shared_opening(self) -> int:
        """The prefix every conversation's first prompt shares (a system prompt), once two have started; else 0."""
        openings = self._openings
        if len(openings) < 2:
            return 0
        return min(common_prefix(openings[0], other) for other in openings[1:])

    def ended(self, ticket: Ticket, output: list[int] | None, *, now: float, answered_n: int = 0) -> None:
        """The call ended: with the answer's ids, or None when it failed, or when the answer carried no ids
        (an OpenAI-style answer without logprobs) with `answered_n`, its length: the next turn of the
        conversation shows them."""
        with self._lock:
            if output is not None:
                self.seen.add(np.concatenate([ticket.prompt, np.asarray(output, dtype=np.int32)]))
            elif answered_n:
                self.seen.add(ticket.prompt)
            c = ticket.conversation
            if c is None or c.prompt is not ticket.prompt:
                return  # a probe, or the conversation has moved on since
            c.last_seen, c.failed = now, output is None and not answered_n
            c.unseen_answer = answered_n or None

    def _forget(self, now: float) -> None:
        had = bool(self._live)
        live = [c for c in self._live if now - c.last_seen < self.forget_after_s]
        held = sum(len(c.prompt) for c in live)
        while live and (len(live) > MAX_CONVERSATIONS or held > self.max_tokens):
            held -= len(live.pop(0).prompt)  # the oldest started first
            self.dropped += 1
        self._live = live
        if had and not live:  # every conversation idled out: nothing of theirs is kept either
            self.seen.clear()
            self._openings = []

    @property
    def started(self) -> int:
        return self._started

    def clear(self) -> None:
        """Drop every id held (the tap stops)."""
        with self._lock:
            self._live, self._openings = [], []
            self.seen.clear()
