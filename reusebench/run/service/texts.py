"""What the users send, as token ids: every text made once with the server's tokenizer, and each user's
conversation, which turns the previous prompt and answer into the next prompt.

Tokenizing up front matters: a ``/tokenize`` call during the run would wake a sleeping server.
"""

from __future__ import annotations

from dataclasses import dataclass

from reusebench.config import corpus, users
from reusebench.config.users import User
from reusebench.config.workload import Workload
from reusebench.llama.client import LlamaClient
from reusebench.llama.facts import NO_LORA
from reusebench.records import Role
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.run.service.calls import Request

CHARS_PER_TOKEN = 12  # generous for the corpus' words (one token per word): texts are cut to tokens after


@dataclass(frozen=True)
class Texts:
    """Token ids of everything the users say, made once with the server's tokenizer."""

    system: list[int]  # BOS + the shared system prompt
    openings: dict[str, list[int]]
    questions: dict[str, list[list[int]]]
    summary: list[int]
    probe_tail: list[int]

    def probe(self, tokens: int, number: int, seen: PerfectCache, in_flight: tuple[str, ...] = ()) -> Request:
        """The health check's `number`-th probe: `tokens` tokens that open as the system prompt does."""
        shared = min(len(self.system), tokens - 1)
        prompt = self.system[:shared] + self.probe_tail[: tokens - shared]
        return Request(users.HEALTH_CHECK, number, users.HEALTH_CHECK, Role.PROBE, prompt, NO_LORA,
                       expected_hit=False, ideal=seen.ideal(prompt), in_flight=in_flight)


def make_texts(client: LlamaClient, workload: Workload, drawn: list[User]) -> Texts:
    """Every token the users will send, from the corpus' words (one tokenizer call per text)."""
    spec = corpus.load_spec("tiny-words")

    def tokens(variant: int, n_tokens: int) -> list[int]:
        found = client.tokenize(corpus.source_text(spec, variant, n_tokens * CHARS_PER_TOKEN))[:n_tokens]
        if len(found) < n_tokens:
            raise ValueError(f"the corpus gave {len(found)} tokens where {n_tokens} were needed")
        return found

    w = workload
    bos = client.tokenize("", add_special=True)
    per_user = w.question_tokens * max(u.turns for u in drawn)
    return Texts(
        system=bos + tokens(1000, w.system_prompt_tokens),
        openings={u.name: tokens(2000 + u.number, u.opening_tokens) for u in drawn},
        questions={u.name: _chunks(tokens(3000 + u.number, per_user), w.question_tokens) for u in drawn},
        summary=tokens(4000, w.summary_tokens),
        probe_tail=tokens(5000, w.health_check.tokens if w.health_check else 1),
    )


class Conversation:
    """One user's prompts turn by turn, and what a perfect cache (`seen`, the run's) would re-process of each."""

    def __init__(self, user: User, texts: Texts, seen: PerfectCache) -> None:
        self.user, self.texts, self.seen = user, texts, seen
        self.prompt = texts.system + texts.openings[user.name]
        self.answer: list[int] | None = None  # what the server generated last turn
        self._seen_sleeps: int | None = None

    def request(self, turn: int, sleeps: int, in_flight: tuple[str, ...] = ()) -> Request:
        """Turn `turn` as a request, sent after `sleeps` sleeps of the server, with `in_flight` calls running."""
        prompt = self.next_prompt(turn)
        kind = self.kind(turn, sleeps)
        return Request(self.user.name, turn, kind, Role.MEASURE, prompt, self.user.request_lora,
                       expected_hit=kind in users.SHOULD_HIT, ideal=self.seen.ideal(prompt), in_flight=in_flight)

    def next_prompt(self, turn: int) -> list[int]:
        """Turn `turn`'s prompt, by the turn's structural kind: a regeneration sends the same prompt again."""
        kind, texts = self.user.kinds[turn - 1], self.texts
        question = texts.questions[self.user.name][turn - 1]
        if turn > 1 and kind == users.HEAD_INSERT:
            assert self.answer is not None
            history = self.prompt[len(texts.system):] + self.answer
            self.prompt = texts.system + texts.summary + history + question
        elif turn > 1 and kind == users.CONTINUES:
            assert self.answer is not None
            self.prompt = self.prompt + self.answer + question
        return self.prompt

    def kind(self, turn: int, sleeps: int) -> str:
        """The kind the turn is recorded as: ``after sleep`` when the server slept since the user's last turn."""
        seen, self._seen_sleeps = self._seen_sleeps, sleeps
        return users.AFTER_SLEEP if seen is not None and seen != sleeps else self.user.kinds[turn - 1]

    def answered(self, generated: list[int]) -> None:
        self.answer = generated


def _chunks(tokens: list[int], size: int) -> list[list[int]]:
    return [tokens[i: i + size] for i in range(0, len(tokens), size)]
