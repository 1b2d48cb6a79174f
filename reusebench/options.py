"""Is each option really active? A verdict with evidence for every option a profile variant sets.

For each option the profile sets, and for the defaults that decide prompt reuse, one
small probe (``PROBES``) gives a verdict:

- ACTIVE: the feature is on and a probe showed it working (or, for sizes and counts,
  the server reported the value it applied);
- DISABLED: the feature is off: the server said so (the line is quoted with its
  level, or an HTTP error), or the value turns it off and the probe saw no effect;
- INEFFECTIVE: accepted and on, but without a measurable effect;
- UNSAFE: in effect, but reused output is not what a computation without reuse gives;
- UNSUPPORTED: this binary's ``--help`` does not know it (found before any launch);
- UNVERIFIED: no probe exists, or the probe could not decide; the evidence says why.

Probes cost a few hundred to ~3K tokens (prompts of random words), not a prefill of
the profile's size, and they only watch the server through channels that do not
change what they check: ``/props`` and ``/metrics`` (they do not wake a sleeping
server; ``GET /slots`` does and is never called), the completion timings and the
``-lv 4`` log. Facts behind every probe: shared/reference/llama-server.md.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import random
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from tabulate import tabulate

from reusebench import binaries, logs, tiny
from reusebench.client import ClientError, Completion, LlamaClient
from reusebench.logs import Event
from reusebench.profiles import OptionValue, Variant
from reusebench.server import LlamaServer, ServerError
from reusebench.session import common_prefix, token_difference


class Verdict(str, Enum):
    ACTIVE = "ACTIVE"
    DISABLED = "DISABLED"
    INEFFECTIVE = "INEFFECTIVE"
    UNSAFE = "UNSAFE"
    UNSUPPORTED = "UNSUPPORTED"
    UNVERIFIED = "UNVERIFIED"


# Tracked by asv as numbers, so a commit that changes a verdict shows in the web UI.
# Stable: never renumber; a new verdict gets the next free number.
VERDICT_CODES: dict[Verdict, int] = {
    Verdict.UNVERIFIED: 0,
    Verdict.ACTIVE: 1,
    Verdict.DISABLED: 2,
    Verdict.INEFFECTIVE: 3,
    Verdict.UNSAFE: 4,
    Verdict.UNSUPPORTED: 5,
}

# Defaults checked even when the profile leaves them unset: the ones that decide reuse.
CHECKED_DEFAULTS: tuple[str, ...] = (
    "parallel", "kv-unified", "mmproj", "lora-init-without-apply", "cache-prompt", "ctx-checkpoints",
    "checkpoint-min-step", "slot-prompt-similarity", "cache-idle-slots", "cache-ram", "cache-reuse",
    "slot-save-path", "sleep-idle-seconds",
)
# Long names that set a probed option; True when the name turns it off.
ALIASES: dict[str, tuple[str, bool]] = {
    "no-cache-prompt": ("cache-prompt", True),
    "no-cache-idle-slots": ("cache-idle-slots", True),
    "no-kv-unified": ("kv-unified", True),
    "swa-checkpoints": ("ctx-checkpoints", False),
}
# Options a newer llama.cpp has and older builds reject (reference section 2, "Help differences").
NEWER_OPTIONS: dict[str, str] = {
    name: "b11434"
    for name in ("log-jsonl", "kv-unified-per-slot", "mmproj-device", "n-cpu-ffn", "lazy-mode", "spec-draft-sampling")
}

PROBE_N_PREDICT = 8  # enough greedy tokens for a stale state to show in the output
PROBE_CTX_PER_SLOT = 4096  # --ctx-size per slot when the profile sets none; holds every probe prompt
MAX_PROBE_PROMPT = 3072  # a probe that would need a longer prompt reports UNVERIFIED instead
PROBE_TAIL_TOKENS = 256  # document tokens before the "4 + n_ubatch before the end" checkpoint
QUESTION_TOKENS = 16
# Two cold computations of one prompt batch identically; a LoRA that is applied moves logprobs by ~1e-2.
LORA_LOGPROB_TOLERANCE = 1e-3
REUSE_CUT_AT = 64  # --cache-reuse probe: remove a chunk this far into the document ...
REUSE_REMOVED = 32  # ... of this many tokens (gotcha 1: "remove a chunk near the start")
MIN_STEP_MARGIN = 16  # user messages this far below and above --checkpoint-min-step
SLEEP_MARGIN_S = 10.0
POLL_S = 0.25
PROBE_TIMEOUT_S = 300.0
USER_DELIMITER = "<|im_start|>user"  # message delimiter of the tiny models' ChatML template

# Start-up lines (libllama INFO, visible at -lv 4) with the sizes the server applied.
N_CTX_LINE = r"llama_context: n_ctx += (\d+)"
N_BATCH_LINE = r"llama_context: n_batch += (\d+)"
N_UBATCH_LINE = r"llama_context: n_ubatch += (\d+)"
N_THREADS_LINE = r"system_info: n_threads = (\d+)"

_HELP_DEFAULT = re.compile(r"\(default: ([^)\[]+)\)")
_HELP_DEFAULT_NUMBER = re.compile(r"\(default: (-?\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class OptionVerdict:
    """One verdict: the option as the profile writes it, its value, and why."""

    option: str
    value: str
    verdict: Verdict
    evidence: tuple[str, ...]
    aspect: str | None = None  # one option can get several verdicts, e.g. slot-save-path "resend after restart"

    @property
    def key(self) -> str:
        """Stable name for asv: ``option`` or ``option[aspect]``."""
        return f"{self.option}[{self.aspect}]" if self.aspect else self.option

    @property
    def code(self) -> int:
        return VERDICT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {
            "option": self.option, "aspect": self.aspect, "value": self.value, "verdict": self.verdict.value,
            "code": self.code, "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class Setting:
    """What a probe checks: the option's name, the value it was given, how to show it."""

    option: str  # as the profile writes it, or the probed name for an unset default
    label: str
    value: OptionValue | None = None  # for the probed option ("no-x: true" gives False); None: the default

    def verdict(self, verdict: Verdict, *evidence: str, aspect: str | None = None) -> OptionVerdict:
        return OptionVerdict(self.option, self.label, verdict, tuple(evidence), aspect)


# Verdicts that make `reusebench check` exit with status 1.
FAILING_VERDICTS = (Verdict.UNSAFE, Verdict.UNSUPPORTED)


def tracked_codes(verdicts: Sequence[OptionVerdict]) -> dict[str, int]:
    """{key: verdict code}, the numbers asv tracks."""
    return {verdict.key: verdict.code for verdict in verdicts}


# --- evidence helpers ----------------------------------------------------------------------------


def quote(event: Event) -> str:
    """A log line with its level; TRC lines print as info (reference section 1)."""
    return f"log [{event.level or 'no level'}] {event.line}"


def timings(completion: Completion) -> str:
    return f"cache_n={completion.cache_n} prompt_n={completion.prompt_n}"


def first_difference(got: Completion, reference: Completion, logprob_tolerance: float | None = None) -> str | None:
    """Where two greedy outputs first differ (positions, ids and logprobs, never text), or None.

    Tokens only by default: a reused and a cold computation batch differently, so their logprobs differ a little.
    """
    differs = token_difference(got, reference)
    if differs is not None:
        return differs
    for position, (a, b) in enumerate(zip(got.probs, reference.probs)):
        if logprob_tolerance is not None and abs(a.logprob - b.logprob) > logprob_tolerance:
            return f"token {position}: logprob {a.logprob:.4f} != reference {b.logprob:.4f}"
    return None


def _flag(value: object) -> str:
    return str(value).lower()


def of_kind(events: Sequence[Event], *kinds: str) -> list[Event]:
    return [event for event in events if event.kind in kinds]


# --- the probe context -----------------------------------------------------------------------------


class ProbeContext:
    """One running server and what the probes share: client, startup log, fresh prompts, the log since a mark."""

    def __init__(self, variant: Variant, server: LlamaServer) -> None:
        self.variant = variant
        self.server = server
        self.client = LlamaClient(server.base_url, server.api_key, timeout_s=PROBE_TIMEOUT_S)
        self._log = logs.LogTail(server.raw_log_path)
        # Read before any request, so it holds start-up lines only (no prompt text).
        self.startup_lines = self._log.read_since(0)
        self.startup = logs.parse_lines(self.startup_lines)
        self.facts = logs.startup_facts(self.startup)
        self.help = binaries.help_table(variant.binary)
        self.bos = self.client.tokenize("", add_special=True)
        self._seed = 0

    def close(self) -> None:
        self.client.close()

    def restart(self) -> None:
        """Stop and start the same server (same arguments, same slot-save directory); it gets a new port."""
        self.client.close()
        self.server.restart()
        self.client = LlamaClient(self.server.base_url, self.server.api_key, timeout_s=PROBE_TIMEOUT_S)

    # options and sizes

    def number(self, setting: Setting, option: str) -> float:
        """The setting's number, else the default `--help` states for `option`."""
        if setting.value is not None:
            return float(setting.value)
        match = _HELP_DEFAULT_NUMBER.search(self.help[option].description)
        if match is None:
            raise ValueError(f"--help states no numeric default for --{option}")
        return float(match.group(1))

    @property
    def doc_tokens(self) -> int:
        """A document long enough that the "4 + n_ubatch before the end" checkpoint lands inside it."""
        n_batch = int(self.startup_value(N_BATCH_LINE) or 2048)
        n_ubatch = int(self.startup_value(N_UBATCH_LINE) or 512)
        return min(n_batch, n_ubatch + 4) + PROBE_TAIL_TOKENS

    @property
    def needs_checkpoints(self) -> bool:
        """The model's memory cannot be cut at any position (recurrent or hybrid), so reuse needs checkpoints."""
        return bool(of_kind(self.startup, "seq_rm_support"))

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

    def complete(self, prompt: Sequence[int], **kwargs: Any) -> Completion:
        return self.client.complete(prompt, n_predict=PROBE_N_PREDICT, n_probs=1, **kwargs)

    def complete_with_server_default(self, prompt: Sequence[int], id_slot: int = -1) -> Completion:
        """A completion without a ``cache_prompt`` field, so the server's --cache-prompt default decides."""
        return self.complete(prompt, cache_prompt=None, id_slot=id_slot)

    # the log

    def mark(self) -> int:
        return self._log.offset()

    def events_since(self, mark: int) -> list[Event]:
        return logs.parse_lines(self._log.read_since(mark))

    def startup_value(self, pattern: str) -> str | None:
        """Group 1 of the first start-up line matching `pattern`."""
        for line in self.startup_lines:
            if match := re.search(pattern, line):
                return match.group(1)
        return None

    def disabled_warning(self, kind: str) -> Event | None:
        return next(iter(of_kind(self.startup, kind)), None)


Probe = Callable[[ProbeContext, Setting], list[OptionVerdict]]


# --- probes: configuration the server reports ---------------------------------------------------------


def probe_parallel(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    props = ctx.client.props()
    evidence = [quote(e) for e in of_kind(ctx.startup, "n_parallel_auto", "slots_initialized")]
    evidence.append(f"/props total_slots={props['total_slots']}")
    expected = None if setting.value is None or int(setting.value) < 0 else int(setting.value)
    applied = props["total_slots"] == ctx.facts["n_slots"] and expected in (None, ctx.facts["n_slots"])
    return [setting.verdict(Verdict.ACTIVE if applied else Verdict.INEFFECTIVE, *evidence)]


def probe_kv_unified(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    n_ctx_slot = ctx.client.props()["default_generation_settings"]["n_ctx"]
    n_ctx = ctx.startup_value(N_CTX_LINE)
    evidence = [quote(e) for e in of_kind(ctx.startup, "slots_initialized")]
    unified = bool(ctx.facts["kv_unified"])
    sharing = "every slot may use all of it" if unified else "each slot owns its share"
    evidence.append(f"/props per-slot n_ctx={n_ctx_slot} of n_ctx={n_ctx} ({sharing})")
    if setting.value is not None and bool(setting.value) != unified:
        return [setting.verdict(Verdict.INEFFECTIVE, *evidence)]
    return [setting.verdict(Verdict.ACTIVE if unified else Verdict.DISABLED, *evidence)]


def probe_mmproj(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    modalities = ctx.client.props().get("modalities", {})
    evidence = [quote(e) for e in of_kind(ctx.startup, "multimodal_loaded")]
    evidence.append(f"/props modalities={modalities}")
    loaded = ctx.facts["multimodal_loaded"] and any(modalities.values())
    if setting.value is None:
        return [setting.verdict(Verdict.INEFFECTIVE if loaded else Verdict.DISABLED, *evidence)]
    return [setting.verdict(Verdict.ACTIVE if loaded else Verdict.INEFFECTIVE, *evidence)]


def probe_logged_value(ctx: ProbeContext, setting: Setting, *, pattern: str, what: str) -> list[OptionVerdict]:
    """Sizes and counts: the value the server applied, from its start-up log."""
    applied = ctx.startup_value(pattern)
    if applied is None:
        return [setting.verdict(Verdict.UNVERIFIED, f"no start-up line states the applied {what}")]
    evidence = f"log: {what} = {applied}"
    if str(applied) != str(setting.value):
        return [setting.verdict(Verdict.INEFFECTIVE, f"{evidence} (the server applied {applied}, not {setting.value})")]
    return [setting.verdict(Verdict.ACTIVE, evidence)]


def probe_metrics(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    before = ctx.client.metrics()
    done = [ctx.complete(ctx.prompt(64))]
    agreement = metrics_agreement(before, ctx.client.metrics(), done)
    return [setting.verdict(Verdict.ACTIVE, "GET /metrics answered", agreement)]


def metrics_agreement(before: dict[str, float], after: dict[str, float], done: Sequence[Completion]) -> str:
    """Do the /metrics counters grow by the prompt_n and cache_n the completions reported?"""
    counted = {name: after.get(f"llamacpp:{name}", 0.0) - before.get(f"llamacpp:{name}", 0.0)
               for name in ("prompt_tokens_total", "prompt_tokens_cached_total")}
    summed = {"prompt_tokens_total": sum(c.prompt_n for c in done),
              "prompt_tokens_cached_total": sum(c.cache_n for c in done)}
    agree = all(counted[name] == summed[name] for name in summed)
    shown = ", ".join(f"{name} +{counted[name]:.0f} (timings: {summed[name]})" for name in summed)
    return f"/metrics {'agrees' if agree else 'DISAGREES'} with the summed timings: {shown}"


# --- probes: LoRA -------------------------------------------------------------------------------------


def _adapter_scales(ctx: ProbeContext, scale: float) -> list[dict[str, float]]:
    return [{"id": index, "scale": scale} for index in range(len(ctx.variant.lora))]


def probe_lora(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    prompt = ctx.prompt(64)
    applied = ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, 1.0))
    zero = ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, 0.0))
    difference = first_difference(applied, zero, LORA_LOGPROB_TOLERANCE)
    if difference is None:
        return [setting.verdict(Verdict.INEFFECTIVE, "output at scale 1 equals output at scale 0")]
    return [setting.verdict(Verdict.ACTIVE, f"output at scale 1 differs from scale 0 ({difference})")]


def probe_lora_init_without_apply(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    adapters = ctx.client.lora_adapters()
    scales = f"GET /lora-adapters scales={[adapter['scale'] for adapter in adapters]}"
    if not adapters:
        verdict = Verdict.DISABLED if setting.value is None else Verdict.INEFFECTIVE
        return [setting.verdict(verdict, f"{scales}: no --lora adapters to hold back")]
    prompt = ctx.prompt(64)
    plain = ctx.complete(prompt, cache_prompt=False)  # no lora field: the global scales apply
    as_applied, as_held_back = (
        first_difference(plain, ctx.complete(prompt, cache_prompt=False, lora=_adapter_scales(ctx, scale)),
                         LORA_LOGPROB_TOLERANCE)
        for scale in (1.0, 0.0)
    )
    evidence = (scales,
                f"output with no lora field {'equals' if as_applied is None else 'differs from'} output with scale 1",
                f"output with no lora field {'equals' if as_held_back is None else 'differs from'} output with scale 0")
    if as_held_back is None and as_applied is not None:
        return [setting.verdict(Verdict.DISABLED if setting.value is None else Verdict.ACTIVE, *evidence)]
    if setting.value is None:
        return [setting.verdict(Verdict.DISABLED, *evidence)]
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence, "adapters are applied at scale 1.0 despite the flag "
                            "(upstream issue #28674)")]


# --- probes: reuse --------------------------------------------------------------------------------------


def probe_cache_prompt(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    prompt = ctx.prompt(ctx.doc_tokens)
    before = ctx.client.metrics()
    done = [ctx.complete_with_server_default(prompt)]
    mark = ctx.mark()
    done.append(ctx.complete_with_server_default(prompt, id_slot=done[0].id_slot or 0))
    evidence = (f"resend of a {len(prompt)}-token prompt with no cache_prompt field: {timings(done[1])}",
                *map(quote, of_kind(ctx.events_since(mark), "forced_full_reprocess")),
                metrics_agreement(before, ctx.client.metrics(), done))
    if done[1].cache_n > len(prompt) // 2:
        return [setting.verdict(Verdict.ACTIVE, *evidence)]
    if setting.value is False:
        return [setting.verdict(Verdict.DISABLED, *evidence, "(--no-cache-prompt logs nothing; cache_n shows it)")]
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence)]


def _reask(ctx: ProbeContext) -> tuple[Completion, list[Event]]:
    """Send a document with one question, then with another: what a checkpoint can save."""
    document, (question, other_question) = ctx.prompt(ctx.doc_tokens), ctx.questions()
    slot = ctx.complete(document + question).id_slot
    mark = ctx.mark()
    reask = ctx.complete(document + other_question, id_slot=slot)  # the slot's own checkpoints, not another slot
    return reask, ctx.events_since(mark)


def probe_ctx_checkpoints(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    reask, events = _reask(ctx)
    configured = [quote(e) for e in of_kind(ctx.startup, "checkpoints_enabled", "checkpoints_disabled")]
    measured = [f"re-ask of a {ctx.doc_tokens}-token document: {timings(reask)}"]
    measured += [quote(e) for e in of_kind(events, "checkpoint_restored", "forced_full_reprocess")]
    if not ctx.needs_checkpoints:
        return [setting.verdict(Verdict.INEFFECTIVE, *configured, *measured,
                                "this model's memory can be cut anywhere (no 'does not support partial sequence "
                                "removal' line), so the server never needs a checkpoint")]
    if ctx.facts["checkpoints_max"] == 0:
        return [setting.verdict(Verdict.DISABLED, *configured, *measured)]
    restored = of_kind(events, "checkpoint_restored") and reask.cache_n > 0
    return [setting.verdict(Verdict.ACTIVE if restored else Verdict.INEFFECTIVE, *configured, *measured)]


def probe_checkpoint_min_step(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """User messages just below and just above the minimum spacing: only the second gets a checkpoint.

    A checkpoint goes at a user message's start when it is the first or the last user message, or lies more than
    the minimum spacing past the previous checkpoint; a last message closes the prompt so neither probe is last.
    """
    configured = [quote(e) for e in of_kind(ctx.startup, "checkpoints_enabled", "checkpoints_disabled")]
    min_step = int(ctx.facts["checkpoints_min_spacing"] or ctx.number(setting, "checkpoint-min-step"))
    delimiter = ctx.client.tokenize(USER_DELIMITER)
    near_end = ctx.doc_tokens - PROBE_TAIL_TOKENS + 64  # past the checkpoints near the prompt's end
    needed = len(ctx.bos) + min_step + 2 * MIN_STEP_MARGIN + near_end
    if not ctx.needs_checkpoints or ctx.facts["checkpoints_max"] == 0:
        return [setting.verdict(Verdict.INEFFECTIVE, *configured, "no checkpoints are made on this server "
                                "(see ctx-checkpoints), so their spacing has no effect")]
    if min_step <= MIN_STEP_MARGIN or needed > MAX_PROBE_PROMPT:
        return [setting.verdict(Verdict.UNVERIFIED, *configured, f"showing it needs a {needed}-token prompt; "
                                f"probes stay under {MAX_PROBE_PROMPT} (set a smaller value to probe it)")]
    first = len(ctx.bos)  # the first user message starts right after BOS and always gets a checkpoint
    below, above = first + min_step - MIN_STEP_MARGIN, first + min_step + MIN_STEP_MARGIN
    prompt = ctx.bos + delimiter + ctx.fresh(below - first - len(delimiter))
    prompt += delimiter + ctx.fresh(above - below - len(delimiter))
    prompt += delimiter + ctx.fresh(MIN_STEP_MARGIN - len(delimiter))
    prompt += delimiter + ctx.fresh(near_end)
    mark = ctx.mark()
    ctx.complete(prompt, extra={"message_delimiters": [{"role": "user", "delimiter": USER_DELIMITER}]})
    created = {int(e.fields["n_tokens"]) for e in of_kind(ctx.events_since(mark), "checkpoint_created")}
    evidence = (*configured, f"user messages at tokens {first}, {below}, {above}: checkpoints at "
                f"{sorted(created)} (expected {above}, not {below}, for a spacing of {min_step})")
    shown = above in created and below not in created
    return [setting.verdict(Verdict.ACTIVE if shown else Verdict.INEFFECTIVE, *evidence)]


def probe_slot_prompt_similarity(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """A prompt sharing more than the threshold with a slot should pick it; one sharing less should not."""
    threshold = ctx.number(setting, "slot-prompt-similarity")
    length = ctx.doc_tokens
    sent = ctx.prompt(length)
    ctx.complete(sent)
    selections: list[Event] = []
    for share in ((1 + threshold) / 2, threshold / 2):  # above, then below the threshold
        keep = max(len(ctx.bos) + 1, int(share * length))
        sent = sent[:keep] + ctx.fresh(length - keep)
        mark = ctx.mark()
        ctx.complete(sent)
        selections += of_kind(ctx.events_since(mark), "slot_selected_by_lcp", "slot_selected_by_lru")[:1]
    kinds = [e.kind for e in selections]
    evidence = [f"prompts sharing {(1 + threshold) / 2:.2f}, then {threshold / 2:.2f} of their tokens with a slot:",
                *map(quote, selections)]
    if threshold == 0:
        return [setting.verdict(Verdict.DISABLED if kinds[:1] == ["slot_selected_by_lru"] else Verdict.INEFFECTIVE,
                                *evidence)]
    shown = kinds == ["slot_selected_by_lcp", "slot_selected_by_lru"]
    return [setting.verdict(Verdict.ACTIVE if shown else Verdict.INEFFECTIVE, *evidence)]


def probe_cache_idle_slots(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    warning = ctx.disabled_warning("cache_idle_slots_need_cache_ram")
    if warning is not None:
        return [setting.verdict(Verdict.DISABLED, quote(warning))]
    policy = [quote(e) for e in of_kind(ctx.startup, "idle_slots_policy")]
    if setting.value is False or not policy:
        return [setting.verdict(Verdict.DISABLED, "no 'idle slots will be saved to prompt cache' start-up line")]
    first = ctx.complete(ctx.prompt(ctx.doc_tokens))
    mark = ctx.mark()
    ctx.complete(ctx.prompt(ctx.doc_tokens))
    events = ctx.events_since(mark)
    saved = [e for e in of_kind(events, "idle_slot_saved") if e.slot == first.id_slot]
    cleared = [e for e in of_kind(events, "prompt_cleared") if e.slot == first.id_slot and e.fields["n_tokens"]]
    evidence = [*policy, f"slot {first.id_slot} idle while another prompt ran: "
                f"{len(saved)} 'saving idle slot to prompt cache' line(s)", *map(quote, cleared)]
    if saved:
        return [setting.verdict(Verdict.ACTIVE, *evidence)]
    if ctx.facts["n_slots"] == 1:
        evidence.append("with one slot, the slot a new task takes is never idle, so nothing is saved")
    return [setting.verdict(Verdict.INEFFECTIVE, *evidence)]


def probe_cache_ram(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """A prompt, one short prompt per slot to push it out of every slot, then the first again.

    Slots are chosen by the server (a request pinned with id_slot never goes through the RAM cache).
    """
    configured = [quote(e) for e in of_kind(ctx.startup, "prompt_cache_enabled", "prompt_cache_disabled")]
    first = ctx.prompt(ctx.doc_tokens)
    ctx.complete(first)
    n_slots = int(ctx.facts["n_slots"] or 1)
    for _ in range(n_slots):
        ctx.complete(ctx.prompt(QUESTION_TOKENS))
    mark = ctx.mark()
    back = ctx.complete(first)
    events = ctx.events_since(mark)
    evidence = [*configured, f"back to the first prompt after {n_slots} other prompt(s) took the {n_slots} slot(s): "
                f"{timings(back)}",
                *map(quote, of_kind(events, "ram_prompt_found", "ram_prompt_too_large", "forced_full_reprocess"))]
    if ctx.facts["prompt_cache_enabled"] is False:
        return [setting.verdict(Verdict.DISABLED, *evidence, "RAM prompt cache off")]
    found = of_kind(events, "ram_prompt_found") and back.cache_n > len(first) // 2
    return [setting.verdict(Verdict.ACTIVE if found else Verdict.INEFFECTIVE, *evidence)]


def probe_cache_reuse(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Remove a chunk near the start and compare the shifted reuse with output computed without reuse."""
    warning = ctx.disabled_warning("cache_reuse_unsupported")
    if warning is not None:
        return [setting.verdict(Verdict.DISABLED, quote(warning))]
    min_chunk = int(ctx.number(setting, "cache-reuse"))
    length = max(ctx.doc_tokens, REUSE_CUT_AT + REUSE_REMOVED + min_chunk + PROBE_TAIL_TOKENS)
    if length > MAX_PROBE_PROMPT:
        return [setting.verdict(Verdict.UNVERIFIED, f"showing it needs a {length}-token prompt; "
                                f"probes stay under {MAX_PROBE_PROMPT}")]
    original = ctx.prompt(length)
    slot = ctx.complete(original).id_slot
    cut = len(ctx.bos) + REUSE_CUT_AT
    edited = original[:cut] + original[cut + REUSE_REMOVED:]
    mark = ctx.mark()
    reused = ctx.complete(edited, id_slot=slot)  # shares too little to be given the same slot unasked
    events = ctx.events_since(mark)
    reference = ctx.complete(edited, cache_prompt=False, id_slot=slot)
    evidence = [f"{REUSE_REMOVED} tokens removed at {cut} of {len(original)}, resent: {timings(reused)}",
                *map(quote, of_kind(events, "cache_reuse_chunk", "cache_reuse_ignored", "checkpoint_restored"))]
    if of_kind(events, "cache_reuse_ignored"):
        return [setting.verdict(Verdict.DISABLED, *evidence)]
    if not of_kind(events, "cache_reuse_chunk"):
        off = " (0 turns chunk reuse off)" if min_chunk == 0 else ""
        return [setting.verdict(Verdict.DISABLED if off else Verdict.INEFFECTIVE, *evidence,
                                f"no chunk was shifted{off}")]
    difference = first_difference(reused, reference)
    if difference is not None:
        return [setting.verdict(Verdict.UNSAFE, *evidence,
                                f"reused output differs from the cache_prompt:false reference: {difference}")]
    stale = [e for e in of_kind(events, "checkpoint_restored") if int(e.fields["n_tokens"]) > cut]
    if stale:
        return [setting.verdict(Verdict.UNSAFE, *evidence, "output matched the reference on this probe, but the "
                                f"restored recurrent state (n_tokens={stale[0].fields['n_tokens']}) still holds the "
                                "removed tokens (reference gotcha 1)")]
    return [setting.verdict(Verdict.ACTIVE, *evidence, "reused output equals the cache_prompt:false reference")]


def probe_slot_save_path(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Save a slot, restart, restore, then resend / re-ask / extend, restoring before each."""
    if setting.value is None:
        try:
            ctx.client.slot_erase(0)
        except ClientError as error:
            return [setting.verdict(Verdict.DISABLED, f"{error} (action=erase)")]
        return [setting.verdict(Verdict.INEFFECTIVE, "slot actions answered without --slot-save-path")]
    document, (question, other_question) = ctx.prompt(ctx.doc_tokens), ctx.questions()
    prompt = document + question
    first = ctx.complete(prompt)
    slot, filename = first.id_slot or 0, f"reusebench-check-{secrets.token_hex(4)}.bin"
    follow_ups = {
        "resend after restart": prompt,
        "re-ask after restart": document + other_question,
        "strict extension after restart": prompt + first.tokens + ctx.fresh(QUESTION_TOKENS),
    }
    try:
        saved = ctx.client.slot_save(slot, filename)["n_saved"]
        ctx.restart()
        verdicts = []
        for aspect, follow_up in follow_ups.items():
            restored = ctx.client.slot_restore(slot, filename)["n_restored"]
            mark = ctx.mark()
            reply = ctx.complete(follow_up, id_slot=slot)
            shared = common_prefix(prompt + first.tokens, follow_up)
            evidence = [f"saved {saved} tokens, restarted, restored {restored}; {reply.prompt_n + reply.cache_n}-token "
                        f"prompt sharing {shared}: {timings(reply)}",
                        *map(quote, of_kind(ctx.events_since(mark), "forced_full_reprocess", "checkpoint_restored"))]
            verdict = Verdict.ACTIVE if reply.cache_n >= shared // 2 else Verdict.INEFFECTIVE
            verdicts.append(setting.verdict(verdict, *evidence, aspect=aspect))
        return verdicts
    finally:
        (Path(str(setting.value)) / filename).unlink(missing_ok=True)


def probe_sleep_idle_seconds(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """Let the server idle past the limit, watching it only through /props (which does not wake it)."""
    seconds = ctx.number(setting, "sleep-idle-seconds")
    if seconds < 0:
        slept = of_kind(ctx.events_since(0), "sleep_entering")
        evidence = (f"{seconds:g} never sleeps: /props is_sleeping={_flag(ctx.client.props().get('is_sleeping'))}",
                    f"{len(slept)} 'entering sleeping state' line(s) during the check")
        return [setting.verdict(Verdict.INEFFECTIVE if slept else Verdict.DISABLED, *evidence)]
    prompt = ctx.prompt(ctx.doc_tokens)
    slot = ctx.complete(prompt).id_slot
    before = ctx.complete(prompt, id_slot=slot)
    mark, started = ctx.mark(), time.monotonic()
    while not ctx.client.props().get("is_sleeping") and time.monotonic() - started < seconds + SLEEP_MARGIN_S:
        time.sleep(POLL_S)
    idle_s = time.monotonic() - started
    if not ctx.client.props().get("is_sleeping"):
        return [setting.verdict(Verdict.INEFFECTIVE, f"/props is_sleeping=false after {idle_s:.1f} s idle")]
    slept = [quote(e) for e in of_kind(ctx.events_since(mark), "sleep_entering")]
    # The reference says /metrics does not wake a sleeping server; build 7e4c0a9 does wake on it. Asked last,
    # once the sleep is shown, so the answer is a finding rather than a disturbance.
    ctx.client.metrics()
    woken_by_metrics = not ctx.client.props().get("is_sleeping")
    after = ctx.complete(prompt, id_slot=slot)
    survived = after.cache_n > len(prompt) // 2
    return [setting.verdict(
        Verdict.ACTIVE,
        f"/props is_sleeping=true after {idle_s:.1f} s idle", *slept,
        f"finding: the caches {'survived' if survived else 'did not survive'} sleep: resend before sleep "
        f"{timings(before)}, after waking {timings(after)}",
        f"finding: GET /metrics {'woke' if woken_by_metrics else 'did not wake'} the sleeping server",
    )]


# --- the probe table ----------------------------------------------------------------------------------

SLEEP_OPTION = "sleep-idle-seconds"
# Option -> probe, run in this order. Probes that change what later ones see come last: slot-save-path
# restarts the server, and sleeping empties every cache.
PROBES: dict[str, Probe] = {
    "parallel": probe_parallel,
    "kv-unified": probe_kv_unified,
    "mmproj": probe_mmproj,
    "ctx-size": functools.partial(probe_logged_value, pattern=N_CTX_LINE, what="n_ctx"),
    "batch-size": functools.partial(probe_logged_value, pattern=N_BATCH_LINE, what="n_batch"),
    "ubatch-size": functools.partial(probe_logged_value, pattern=N_UBATCH_LINE, what="n_ubatch"),
    "threads": functools.partial(probe_logged_value, pattern=N_THREADS_LINE, what="n_threads"),
    "metrics": probe_metrics,
    "lora": probe_lora,
    "lora-init-without-apply": probe_lora_init_without_apply,
    "cache-prompt": probe_cache_prompt,
    "ctx-checkpoints": probe_ctx_checkpoints,
    "checkpoint-min-step": probe_checkpoint_min_step,
    "slot-prompt-similarity": probe_slot_prompt_similarity,
    "cache-idle-slots": probe_cache_idle_slots,
    "cache-ram": probe_cache_ram,
    "cache-reuse": probe_cache_reuse,
    "slot-save-path": probe_slot_save_path,
    SLEEP_OPTION: probe_sleep_idle_seconds,
}


# --- what to check -----------------------------------------------------------------------------------


def _label(value: OptionValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_to_check(variant: Variant) -> list[tuple[Setting, Probe | None]]:
    """The variant's options and the reuse defaults, each with its probe (None: no probe yet), in probe order."""
    table = binaries.help_table(variant.binary)
    written: dict[str, list[Setting]] = {}
    for name, value in variant.options.items():
        probed, negated = ALIASES.get(name, (name, False))
        written.setdefault(probed, []).append(Setting(name, _label(value), (not value) if negated else value))
    if variant.mmproj is not None:
        written["mmproj"] = [Setting("mmproj", variant.mmproj.name, str(variant.mmproj))]
    if variant.lora:
        written["lora"] = [Setting("lora", ", ".join(path.name for path in variant.lora), len(variant.lora))]
    checked: list[tuple[Setting, Probe | None]] = []
    for probed, probe in PROBES.items():
        settings = written.pop(probed, [])
        if not settings and probed in CHECKED_DEFAULTS:
            default = _HELP_DEFAULT.search(table[probed].description) if probed in table else None
            settings = [Setting(probed, f"default ({default.group(1).strip()})" if default else "not set")]
        checked += [(setting, probe) for setting in settings]
    checked += [(setting, None) for settings in written.values() for setting in settings]
    return checked


def unsupported_options(variant: Variant) -> list[OptionVerdict]:
    """Options this binary's --help does not accept as written; found without launching anything."""
    table = binaries.help_table(variant.binary)
    build = binaries.version(variant.binary)
    found = []
    for name, value in variant.options.items():
        entry, label = table.get(name), _label(value)
        if entry is None:
            newer = f" (it exists from llama.cpp {NEWER_OPTIONS[name]})" if name in NEWER_OPTIONS else ""
            close = difflib.get_close_matches(name, binaries.help_options(variant.binary), n=1)
            hint = f"; did you mean --{close[0]}?" if close and not newer else ""
            reason = f"`llama-server --help` of build {build} does not list --{name}{newer}{hint}"
        elif entry.removed:
            reason = f"--help of build {build}: {entry.description}"
        elif entry.takes_value == (value is True):
            reason = f"--{name} {'takes a value' if entry.takes_value else 'is a bare flag'}, got {label}"
        else:
            continue
        found.append(OptionVerdict(name, label, Verdict.UNSUPPORTED, (reason,)))
    return found


def launch_args(variant: Variant) -> tuple[list[str], list[str]]:
    """(all llama-server arguments, the ones the check adds): a probe-sized context and /metrics."""
    added: list[str] = []
    if variant.option("ctx-size") is None:
        slots = variant.option("parallel")
        n_slots = int(slots) if slots is not None and int(slots) > 0 else 4  # auto gives 4 slots
        added += ["--ctx-size", str(PROBE_CTX_PER_SLOT * n_slots)]
    if variant.option("metrics") is None:
        added.append("--metrics")
    return variant.server_args() + added, added


# --- running the check ----------------------------------------------------------------------------------


def check_variant(variant: Variant, *, progress: Callable[[str], None] | None = None) -> list[OptionVerdict]:
    """Verdicts for every option `variant` sets and every reuse default; stops every server it starts."""
    say = progress or (lambda _message: None)
    checked = settings_to_check(variant)
    unsupported = unsupported_options(variant)
    if unsupported:
        names = ", ".join(f"--{verdict.option}" for verdict in unsupported)
        rejected = {verdict.option for verdict in unsupported}
        not_run = f"not launched: llama-server refuses to start with {names}"
        return unsupported + [setting.verdict(Verdict.UNVERIFIED, not_run)
                              for setting, _ in checked if setting.option not in rejected]
    args, _ = launch_args(variant)
    with contextlib.ExitStack() as stack:  # stops the server (and deletes its raw log) whatever happens
        server = LlamaServer(variant.binary.path, args)
        stack.callback(server.close)
        try:
            server.start()
            ctx = ProbeContext(variant, server)
        except (ServerError, ClientError) as error:
            return [setting.verdict(Verdict.UNVERIFIED, f"llama-server did not start: {error}")
                    for setting, _ in checked]
        stack.callback(ctx.close)
        verdicts: list[OptionVerdict] = []
        for setting, probe in checked:
            say(f"{setting.option}: {'probing' if probe else 'no probe'}")
            verdicts += _run_probe(ctx, setting, probe)
        return verdicts


def _run_probe(ctx: ProbeContext, setting: Setting, probe: Probe | None) -> list[OptionVerdict]:
    if probe is None:
        return [setting.verdict(Verdict.UNVERIFIED, "no probe for this option yet")]
    mark = ctx.mark()
    try:
        verdicts = probe(ctx, setting)
    except (ClientError, ServerError, ValueError, KeyError) as error:  # KeyError: a reply without a field
        return [setting.verdict(Verdict.UNVERIFIED, f"probe failed: {type(error).__name__}: {error}")]
    # A server that fell asleep mid-probe emptied its caches: the probe measured that, not the option.
    if setting.option != SLEEP_OPTION and of_kind(ctx.events_since(mark), "sleep_entering"):
        note = "the server fell asleep during this probe (sleep-idle-seconds), so the result is not trusted"
        return [replace(v, verdict=Verdict.UNVERIFIED, evidence=(note, *v.evidence)) for v in verdicts]
    return verdicts


# --- output -----------------------------------------------------------------------------------------------

EVIDENCE_WIDTH = 100


def render_table(verdicts: Sequence[OptionVerdict]) -> str:
    rows = [(v.key, v.value, v.verdict.value, "\n".join(v.evidence)) for v in verdicts]
    return tabulate(rows, headers=("option", "value", "verdict", "evidence"), tablefmt="simple_grid",
                    maxcolwidths=[None, 24, None, EVIDENCE_WIDTH])


def describe_launch(variant: Variant) -> dict[str, Any]:
    """What was checked: profile, variant, binary and its build, and the arguments the check adds."""
    return {
        "profile": variant.profile, "variant": variant.name, "model": variant.model_spec,
        "binary": str(variant.binary.path), "build": binaries.version(variant.binary),
        "added_args": launch_args(variant)[1],
    }


def render_report(variant: Variant, verdicts: Sequence[OptionVerdict]) -> str:
    launch = describe_launch(variant)
    header = (f"{launch['profile']} / {launch['variant']} ({launch['model']}), llama-server build {launch['build']}; "
              f"the check adds {' '.join(launch['added_args']) or 'nothing'}")
    return f"{header}\n{render_table(verdicts)}"
