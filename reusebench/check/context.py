"""What the option probes share: the running server, its start-up log, fresh prompts, and evidence lines."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from reusebench import tiny
from reusebench.check.verdicts import OptionVerdict, Setting
from reusebench.llama import facts, logs, startup
from reusebench.llama.client import Completion, LlamaClient, Prompt
from reusebench.llama.logs import Event
from reusebench.llama.server import Server
from reusebench.reuse import verification
from reusebench.run import noise
from reusebench.run.launch import LaunchSpec

PROBE_N_PREDICT = 8  # enough greedy tokens for a stale state to show in the output
PROBE_TAIL_TOKENS = 256  # document tokens before the "4 + n_ubatch before the end" checkpoint
QUESTION_TOKENS = 16


# --- evidence lines --------------------------------------------------------------------------------------


def quote(event: Event) -> str:
    """A log line with its level; the server prints its trace-level lines with the info letter."""
    return f"log [{event.level or 'no level'}] {event.line}"


def timings(completion: Completion) -> str:
    return f"cache_n={completion.cache_n} prompt_n={completion.prompt_n}"


def of_kind(events: Sequence[Event], *kinds: str) -> list[Event]:
    return [event for event in events if event.kind in kinds]


def flag(value: object) -> str:
    """A setting or /props value as the evidence writes it: `true`, `false`, a number."""
    return str(value).lower()


# --- the probe context -----------------------------------------------------------------------------------


class ProbeContext:
    """One running server and what the probes share: client, start-up log, fresh prompts, the log since a mark."""

    def __init__(self, spec: LaunchSpec, handle: Server) -> None:
        self.spec = spec  # what was launched, resolved once
        self.handle = handle
        self.capabilities = spec.capabilities  # the build's, where builds differ (``reusebench.capability``)
        # Read before any request, so it holds start-up lines only (no prompt text).
        self.startup_lines = handle.lines_since(0)
        self.startup = logs.parse_lines(self.startup_lines)
        self.facts = startup.startup_facts(self.startup)
        self.help = spec.build.help
        self.memory = spec.memory
        self.bos = self.client.tokenize("", add_special=True)
        self._seed = 0

    @property
    def client(self) -> LlamaClient:
        return self.handle.client  # a restart gives a new port, so always the handle's current client

    # options and sizes

    def number(self, setting: Setting, option: str) -> float:
        """The setting's number, else the default `--help` states for `option`."""
        if setting.value is not None:
            return float(setting.value)
        default = self.help[option].default_number
        if default is None:
            raise ValueError(f"--help states no numeric default for --{option}")
        return float(default)

    @property
    def doc_tokens(self) -> int:
        """A document long enough that the "4 + n_ubatch before the end" checkpoint lands inside it."""
        launch = self.spec.launch  # the batch sizes as resolved once, the reuse model's own
        return facts.end_checkpoint_offsets(launch.n_batch, launch.n_ubatch)[0] + PROBE_TAIL_TOKENS

    @property
    def needs_checkpoints(self) -> bool:
        """The model's memory cannot be cut at any position (recurrent or hybrid), so reuse needs checkpoints: as the
        server reported it at start-up, the reuse model's memory."""
        return self.memory.needs_checkpoints

    # prompts and requests

    def fresh(self, n_tokens: int) -> list[int]:
        """`n_tokens` tokens of random words no other probe prompt shares."""
        self._seed += 1
        words = random.Random(self._seed)
        tokens: list[int] = []
        while len(tokens) < n_tokens:
            # no leading space: SentencePiece would make it a lone "▁" token that every prompt shares
            text = " ".join(words.choice(tiny.WORDS) for _ in range(n_tokens - len(tokens) + 8))
            tokens += self.client.tokenize(text)
        return tokens[:n_tokens]

    def prompt(self, n_tokens: int) -> list[int]:
        return self.bos + self.fresh(n_tokens)

    def questions(self) -> tuple[list[int], list[int]]:
        """Two questions that differ from their first token on, so a re-ask shares only the document."""
        first = self.fresh(QUESTION_TOKENS)
        for _ in range(8):
            second = self.fresh(QUESTION_TOKENS)
            if second[0] != first[0]:
                return first, second
        raise ValueError("random questions keep starting with the same token")

    def complete(self, prompt: Prompt, **kwargs: Any) -> Completion:
        return self.client.complete(prompt, n_predict=PROBE_N_PREDICT, n_probs=1, **kwargs)

    def complete_with_server_default(self, prompt: Sequence[int], id_slot: int = -1) -> Completion:
        """A completion without a ``cache_prompt`` field, so the server's --cache-prompt default decides."""
        return self.complete(prompt, cache_prompt=None, id_slot=id_slot)

    # the log

    def mark(self) -> int:
        return self.handle.mark()

    def events_since(self, mark: int) -> list[Event]:
        return self.handle.events_since(mark)

    def applied(self, name: str) -> int | None:
        """A size the server applied, from its start-up log (``startup.APPLIED_NUMBERS``)."""
        return startup.applied_number(self.startup_lines, name)

    def disabled_warning(self, kind: str) -> Event | None:
        return next(iter(of_kind(self.startup, kind)), None)

    # reused output against no reuse

    def output_check(self, reused: Completion, reference: Completion, prompt: Prompt,
                     **kwargs: Any) -> tuple[str, str]:
        """identical, within noise or WRONG (``verification.judge``), with its evidence. An output that is not
        identical is judged against the noise band of its prompt (``noise.measure``: this server restarted at
        another ubatch), then the server is restarted as it was (the probes after this one start from an empty
        server)."""
        found = verification.difference(reused, reference)
        if found.identical:
            return verification.IDENTICAL, "identical to the cache_prompt:false reference"
        try:
            measured = noise.measure(self.handle, self.spec.launch.n_ubatch,
                                     [(reference, lambda: self.complete(prompt, cache_prompt=False, **kwargs))])
        finally:
            self.handle.restart()
        outcome = verification.judge(found, measured.band)
        assert outcome is not None
        return outcome, (f"against the cache_prompt:false reference: {found.describe()}; noise band "
                         f"{measured.band:.2g} (the reference at ubatch {measured.n_ubatch}), so {outcome}")


Probe = Callable[[ProbeContext, Setting], list[OptionVerdict]]
