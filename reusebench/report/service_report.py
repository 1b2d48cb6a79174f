"""What a workload run shows: miss rates by class, the cause of each miss, interference, the health check.

Read from the records alone (``reusebench.run.service`` writes them), so a report can be rebuilt from
``results/``. Every rate has its denominator beside it. The classes are report B's:

- by what the turn could hope for: ``continues``/``regenerate`` should hit; ``first``, ``head insert`` and
  ``after sleep`` cannot (``reusebench.config.users``), and are counted apart;
- by where the reuse came from: the slot kept the conversation (``slot-kept``), the RAM cache gave it back
  (``RAM-restored``), or neither held it (``not held``);
- with or without a LoRA.

A should-hit turn that re-processed more than a perfect cache is explained by the first rule of
``MISS_CAUSES`` that fits its log. Interference compares other users' requests whose decoding (or whose
wait for the first token) and a long prefill mostly overlapped with those that overlapped none; decode ms per token
is the server's own (``predicted_ms / predicted_n``: the time between the slot's tokens, batch waits included).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tabulate import tabulate

from reusebench.config import users, workload
from reusebench.records import Extra, Record, Role, StepVerdict, lora_applied, outcome

LORA_AFTER_RESTORE = "LoRA-change clear after restore"
SIMILARITY_STOLE = "similarity stole the slot"
LRU_EVICTED = "LRU evicted from RAM"
CHECKPOINT_LIMIT = "checkpoint limit"
FORCED_FULL = "forced full re-processing"
TOO_LARGE = "state larger than the RAM cache (skipped)"
ROUTES = ("slot-kept", "RAM-restored", "not held")


@dataclass(frozen=True)
class Turn:
    """One user turn as the report sees it."""

    record: Record
    outcome: StepVerdict  # hit, partial or miss
    route: str  # one of ROUTES
    cause: str | None  # why a should-hit turn was not a hit; None for hits and turns that cannot hit
    expected: StepVerdict | None = None  # the outcome the reuse model predicted (a serial run's), else None

    @property
    def should_hit(self) -> bool:
        return bool(self.record.expected_hit)

    @property
    def with_lora(self) -> bool:
        return lora_applied(self.record.lora)


@dataclass(frozen=True)
class Context:
    """What a miss's cause may depend on beyond its own log lines: the run's other calls."""

    by_user: dict[str, list[Record]]
    calls: list[Record]
    system_tokens: int


def _cause(r: Record) -> dict[str, Any]:
    return r.cause or {}


def _previous(r: Record, ctx: Context) -> Record | None:
    earlier = [p for p in ctx.by_user.get(r.user or "", []) if (p.turn or 0) < (r.turn or 0)]
    return earlier[-1] if earlier else None


def _between(r: Record, ctx: Context) -> list[Record]:
    """The calls that started after this user's previous turn ended and before this turn."""
    prev = _previous(r, ctx)
    start = prev.ended_at if prev is not None else 0.0
    return [o for o in ctx.calls if start <= o.started_at <= r.started_at and o is not r]


def _stolen(r: Record, ctx: Context) -> bool:
    """Another request took the slot this user's last turn left, by prompt similarity, before this turn."""
    prev = _previous(r, ctx)
    return prev is not None and any(o.user != r.user and o.slot == prev.slot and _cause(o).get("selection") == "lcp"
                                    for o in _between(r, ctx))


def _evicted_since(r: Record, ctx: Context) -> bool:
    return any(o.extra.get("evicted_mib") for o in _between(r, ctx))


def _too_large(r: Record, ctx: Context) -> bool:
    """The conversation left its slot as a state larger than the whole RAM cache, which skips it (lost)."""
    prev = _previous(r, ctx)
    return prev is not None and any(
        _cause(o).get("ram_skipped_too_large")
        and max([*o.extra.get("displaced", []), *o.extra.get("idle_saved", [])], default=0) >= (prev.prompt_tokens or 0)
        for o in _between(r, ctx))


def _found(r: Record) -> bool:
    """The server had the conversation: its slot was chosen for it by similarity, or the RAM cache gave it back.
    Otherwise a LoRA clear or a forced re-processing on the slot it got is incidental: there was nothing to keep."""
    return bool(_cause(r).get("ram_restored")) or _cause(r).get("selection") == "lcp"


# First match wins. A wake empties everything; a LoRA clear after a RAM restore is report B's bug (whatever it
# throws away was just found); then, when the server had the conversation, what made it unusable; when it had
# not, where the conversation went.
MISS_CAUSES: tuple[tuple[str, Callable[[Record, Context], bool]], ...] = (
    ("woke from sleep", lambda r, ctx: bool(_cause(r).get("woke"))),
    (LORA_AFTER_RESTORE, lambda r, ctx: bool(_cause(r).get("lora_clear_after_ram_restore"))),
    ("LoRA-change clear", lambda r, ctx: _found(r) and bool(_cause(r).get("lora_clear"))),
    (CHECKPOINT_LIMIT, lambda r, ctx: _found(r) and bool(_cause(r).get("forced_full"))
     and bool((_previous(r, ctx) or r).extra.get("checkpoints_erased_old"))),
    (FORCED_FULL, lambda r, ctx: _found(r) and bool(_cause(r).get("forced_full"))),
    ("found, then partly re-processed", lambda r, ctx: _found(r)),
    (SIMILARITY_STOLE, _stolen),
    (TOO_LARGE, _too_large),
    (LRU_EVICTED, _evicted_since),
    ("not in the slot nor in RAM", lambda r, ctx: True),
)


def route(r: Record) -> str:
    cause = _cause(r)
    if cause.get("ram_restored"):
        return "RAM-restored"
    return "slot-kept" if cause.get("selection") == "lcp" else "not held"


def turns(records: Sequence[Record]) -> list[Turn]:
    calls = sorted((r for r in records if r.role in (Role.MEASURE, Role.PROBE) and not r.error),
                   key=lambda r: r.started_at)
    summary = next((r for r in records if r.role == Role.SESSION), None)
    ctx = Context({}, calls, summary.extra.get("system_prompt_tokens", 0) if summary else 0)
    for r in calls:
        ctx.by_user.setdefault(r.user or "", []).append(r)
    found = []
    for r in calls:
        if r.role != Role.MEASURE:
            continue
        result = outcome(r, ctx.system_tokens)
        cause = None
        if result != StepVerdict.HIT and r.expected_hit:
            cause = next(name for name, fits in MISS_CAUSES if fits(r, ctx))
        found.append(Turn(r, result, route(r), cause, _expected_outcome(r, ctx.system_tokens)))
    return found


def _expected_outcome(r: Record, shared: int) -> StepVerdict | None:
    """The outcome had the turn re-processed what the reuse model predicted."""
    if r.expected is None or r.prompt_tokens is None:
        return None
    return outcome(replace(r, prompt_n=r.expected, cache_n=r.prompt_tokens - r.expected,
                           excess=r.expected - (r.ideal or 0)), shared)


def _rate(part: int, whole: int) -> str:
    return f"{part} of {whole} ({100 * part / whole:.0f}%)" if whole else "0 of 0"


def _kinds(kinds: Sequence[str], found: Sequence[Turn]) -> list[str]:
    """The kinds a table lists: every kind a workload sends, and those only the tap sees where they occurred."""
    return [k for k in kinds if k in users.WORKLOAD_KINDS or any(t.record.step == k for t in found)]


def miss_table(found: Sequence[Turn]) -> str:
    """Misses (and partials) per class, each over its own turns; where the run predicted each turn (a serial run),
    the misses the reuse model expected beside them."""
    predicted = bool(found) and all(t.expected is not None for t in found)

    def row(label: str, group: list[Turn]) -> list[str]:
        misses = sum(t.outcome == StepVerdict.MISS for t in group)
        partial = sum(t.outcome == StepVerdict.PARTIAL for t in group)
        expected = [str(sum(t.expected == StepVerdict.MISS for t in group))] if predicted else []
        return [label, str(len(group)), _rate(misses, len(group)), *expected, str(partial)]

    should = [t for t in found if t.should_hit]
    rows = [row("should hit (conversation continues, regenerate)", should)]
    rows += [row(f"  {name}", [t for t in should if t.route == name]) for name in ROUTES]
    rows += [row("  with LoRA", [t for t in should if t.with_lora]),
             row("  without LoRA", [t for t in should if not t.with_lora])]
    rows += [row(f"  {kind}", [t for t in should if t.record.step == kind]) for kind in _kinds(users.SHOULD_HIT, should)]
    cannot = [t for t in found if not t.should_hit]
    rows.append(row("cannot hit", cannot))
    rows += [row(f"  {kind}", [t for t in cannot if t.record.step == kind]) for kind in _kinds(users.CANNOT_HIT, cannot)]
    headers = ["turns", "n", "missed (re-processed everything)", *(["expected"] if predicted else []), "partial"]
    return tabulate(rows, headers, tablefmt="github", disable_numparse=True)


def expected_line(records: Sequence[Record]) -> str | None:
    """Measured against the reuse model, request by request, where the run predicted them (a serial run)."""
    calls = [r for r in records if r.role in (Role.MEASURE, Role.PROBE) and not r.error]
    if not calls or any(r.expected is None for r in calls):
        return None
    differ = [r for r in calls if r.prompt_n != r.expected]
    if not differ:
        return f"measured equals expected (the build's reuse model) on every one of {len(calls)} requests"
    first = differ[0]
    return (f"measured differs from expected on {len(differ)} of {len(calls)} requests (UNEXPECTED); first: "
            f"{first.user} turn {first.turn} ({first.step}): expected {first.expected:,} ({first.cause_expected}), "
            f"measured {first.prompt_n:,} ({(first.cause or {}).get('summary', 'no log')})")


def miss_causes(found: Sequence[Turn]) -> Counter[str]:
    return Counter(t.cause for t in found if t.cause is not None)


def cause_table(found: Sequence[Turn]) -> str:
    should = [t for t in found if t.should_hit]
    rows = []
    for cause, n in miss_causes(found).most_common():
        group = [t for t in should if t.cause == cause]
        rows.append([cause, n, sum(t.with_lora for t in group), Counter(t.route for t in group).most_common(1)[0][0]])
    return tabulate(rows, ["cause (from the log)", f"turns (of {len(should)} that should hit)", "with LoRA",
                           "mostly"], tablefmt="github", disable_numparse=True) if rows else "no misses"


# -- interference -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interference:
    """Other users' per-request figures while a long prefill ran, against while none did (ms)."""

    decode_during: list[float]  # ms per generated token
    decode_alone: list[float]
    ttft_during: list[float]
    ttft_alone: list[float]

    @staticmethod
    def percentile(values: list[float], q: int) -> float | None:
        if not values:
            return None
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1]

    def ratio(self, during: list[float], alone: list[float], q: int) -> float | None:
        a, b = self.percentile(during, q), self.percentile(alone, q)
        return None if a is None or not b else a / b


def _overlap(start: float, end: float, spans: Iterable[tuple[float, float]]) -> float:
    """How much [start, end] overlaps the one of `spans` it overlaps most, as a share of the shorter of the two:
    1 for a decode inside a prefill and for a long decode that a whole prefill ran through."""
    if end <= start:
        return 0.0
    return max((max(0.0, min(end, e) - max(start, s)) / min(end - start, e - s) for s, e in spans if e > s),
               default=0.0)


def spans(r: Record) -> tuple[tuple[float, float], tuple[float, float]]:
    """(prefill, decode) of one call in wall-clock seconds, from the server's own times anchored at the end of
    the stream: a client thread on a busy CPU may read the first tokens late, the end it reads when it comes."""
    decode_start = r.ended_at - (r.predicted_ms or 0) / 1000
    return (decode_start - (r.prompt_ms or 0) / 1000, decode_start), (decode_start, r.ended_at)


def interference(records: Sequence[Record], long_prefill_tokens: int) -> Interference:
    """Each other user's request is 'during' when its decoding (or its wait for the first token) and another
    user's long prefill overlap by at least half of the shorter of the two, 'alone' when they do not overlap at
    all; in between it counts in neither."""
    calls = [r for r in records if r.role in (Role.MEASURE, Role.PROBE) and not r.error and r.prompt_ms is not None]
    long_spans = [(r.user, spans(r)[0]) for r in calls if (r.prompt_n or 0) >= long_prefill_tokens]
    result = Interference([], [], [], [])
    for r in calls:
        if r.role != Role.MEASURE or (r.prompt_n or 0) >= long_prefill_tokens:
            continue
        others = [span for user, span in long_spans if user != r.user]
        (_, first), decode = spans(r)
        for share, value, during, alone in (
                (_overlap(*decode, others), r.predicted_ms / r.predicted_n if r.predicted_n and r.predicted_ms is not None else None,
                 result.decode_during, result.decode_alone),
                (_overlap(r.started_at, first, others), r.ttft_ms, result.ttft_during, result.ttft_alone)):
            if value is not None and share >= 0.5:
                during.append(value)
            elif value is not None and share == 0:
                alone.append(value)
    return result


def interference_table(i: Interference) -> str:
    def cells(values: list[float]) -> list[str]:
        return [str(len(values))] + [f"{v:.1f}" if (v := i.percentile(values, q)) is not None else "-"
                                     for q in (50, 90)]

    def ratio(during: list[float], alone: list[float]) -> list[str]:
        return [f"{r:.2f}x" if (r := i.ratio(during, alone, q)) is not None else "-" for q in (50, 90)]

    rows = [["decode ms/token, during a long prefill", *cells(i.decode_during), *ratio(i.decode_during, i.decode_alone)],
            ["decode ms/token, no long prefill", *cells(i.decode_alone), "", ""],
            ["TTFT ms, during a long prefill", *cells(i.ttft_during), *ratio(i.ttft_during, i.ttft_alone)],
            ["TTFT ms, no long prefill", *cells(i.ttft_alone), "", ""]]
    return tabulate(rows, ["other users' requests", "n", "p50", "p90", "p50 ratio", "p90 ratio"],
                    tablefmt="github", disable_numparse=True)


# -- the health check ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthEffect:
    probes: int
    took_slot: int  # selected by similarity a slot that held a conversation
    took_big_slot: int  # ... one of at least long_prefill_tokens
    pushed_to_ram: int  # that conversation was saved to the RAM cache before the probe overwrote it


def health_effect(records: Sequence[Record], long_prefill_tokens: int) -> HealthEffect:
    probes = [r for r in records if r.role == Role.PROBE and not r.error]
    took = [r for r in probes if _cause(r).get("selection") == "lcp" and r.extra.get("displaced")]
    return HealthEffect(len(probes), len(took),
                        sum(max(r.extra["displaced"]) >= long_prefill_tokens for r in took),
                        sum(not _cause(r).get("ram_skipped_too_large") for r in took))


# -- the whole report --------------------------------------------------------------------------------


def findings(found: Sequence[Turn], health: HealthEffect) -> list[str]:
    """Report B's two findings, named by cause with counts, when the run shows them."""
    lines = []
    restored = [t for t in found if t.should_hit and t.route == "RAM-restored"]
    lora_clears = sum(t.cause == LORA_AFTER_RESTORE for t in found)
    if lora_clears:
        lines.append(f"{LORA_AFTER_RESTORE}: {lora_clears} should-hit turns found their conversation in RAM and lost "
                     f"it to the LoRA comparison (cache_n 0), {_rate(lora_clears, len(restored))} of the "
                     "should-hit turns restored from RAM")
    if health.took_slot:
        lines.append(f"the health check took a conversation's slot by prompt similarity: {health.took_slot} of "
                     f"{health.probes} probes ({health.took_big_slot} of them a long conversation's), "
                     f"{health.pushed_to_ram} of those conversations pushed to the RAM cache")
    return lines or ["neither of report B's findings showed in this run"]


# Why a free-running run's counts differ between runs of one build (its measured spread is in docs/report-b.md).
FREE_RUNNING_NOTE = ("free-running: the users' threads reach the server in the order the CPU's scheduling gives "
                     "them, and which slot a turn lands in, what the RAM cache holds and what LRU evicts follow that "
                     "order, so these counts vary from run to run of one build; the serial schedule (the default) "
                     "repeats them exactly")


def tap_section(extra: Extra, records: Sequence[Record]) -> str:
    """What a tap's summary adds: what it did not record, how it tokenized, and what its log lacked."""
    tokenize = extra.get("tokenize") or {}
    tokens, ms = tokenize.get("tokens", 0), tokenize.get("ms", 0.0)
    unrecorded = extra.get("unrecorded") or {}
    lines = [
        f"relayed {extra.get('upstream')}; {extra.get('requests')} completion requests recorded, "
        f"{extra.get('interrupted', 0)} of them interrupted; "
        + ("other requests relayed unrecorded: " + ", ".join(f"{path} x{n}" for path, n in sorted(unrecorded.items()))
           if unrecorded else "no other requests"),
        (f"tokenized through the server (/apply-template, /tokenize): {tokenize.get('calls', 0)} prompts, "
         f"{tokens:,} tokens, {ms / tokens * 1000:.2f} ms per 1K tokens" if tokens else
         "no prompt needed the server's tokenizer (the requests sent token ids)"),
        f"prompt length against the server's prompt_n + cache_n: {extra.get('length_mismatches', 0)} mismatch(es); "
        f"requests the tap could not class: {extra.get('unclassed', 0)}; "
        f"requests without their task in the server log: {extra.get('without_task', 0)}; "
        f"server lifetimes in the log: {extra.get('server_lifetimes', 0)}",
        "classes: " + ", ".join(f"{kind} {n}" for kind, n in Counter(r.step for r in records if r.role in (
            Role.MEASURE, Role.PROBE)).most_common()),
    ]
    lines += [f"warning: {w}" for w in extra.get("log_warnings") or ()]
    return "\n".join(f"- {line}" for line in lines)


def render(records: Sequence[Record]) -> str:
    summary = next((r for r in records if r.role == Role.SESSION), None)
    extra = summary.extra if summary else Extra()
    long_tokens = int(extra.get("long_prefill_tokens", 4096))
    found = turns(records)
    health = health_effect(records, long_tokens)
    # records from before the serial schedule say none: they came from threads, the only way there was
    schedule = extra.get("schedule", workload.FREE_RUNNING)
    head = (f"{summary.scenario} on {summary.profile} [{summary.variant}] ({summary.model}), build {summary.build}, "
            f"{schedule}: {extra.get('requests')} requests from {extra.get('users')} users in "
            f"{(summary.wall_ms or 0) / 1000:.0f} s, {extra.get('sleeps')} sleep(s); stopped: {extra.get('stopped_by')}"
            ) if summary else "no summary record"
    errors = [r for r in records if r.error]
    return "\n\n".join((
        head + (f"; {len(errors)} failed call(s): {errors[0].error}" if errors else "")
        + (f"\n\n_{FREE_RUNNING_NOTE}._" if summary and schedule == workload.FREE_RUNNING else ""),
        "### Findings\n\n" + "\n".join(f"- {line}" for line in findings(found, health)),
        "### Miss rates by class\n\n" + miss_table(found) + (f"\n\n{line}" if (line := expected_line(records)) else ""),
        "### Why should-hit turns missed (from the log)\n\n" + cause_table(found),
        f"### Interference (a long prefill: at least {long_tokens:,} tokens)\n\n"
        + (interference_table(interference(records, long_tokens)) if schedule != workload.SERIAL else
           "none: the serial schedule sends one request at a time (`reusebench workload interference` measures it)"),
        f"### The health check\n\n{health.probes} probes; took a conversation's slot by similarity: "
        f"{health.took_slot} (a long conversation's: {health.took_big_slot}); pushed it to RAM: {health.pushed_to_ram}",
        *((f"### The tap\n\n{tap_section(extra, records)}",) if schedule == workload.TAPPED else ()),
    ))


MISS_FIGURES: tuple[str, ...] = (
    "should hit", *ROUTES, "with LoRA", "without LoRA", *(f"cause: {name}" for name, _ in MISS_CAUSES),
    "health check took a conversation's slot")
INTERFERENCE_FIGURES: tuple[str, ...] = tuple(
    f"{what} {when} p{q}" for what in ("decode ms per token", "ttft ms") for when in ("during", "alone")
    for q in (50, 90))


def figures(records: Sequence[Record]) -> dict[str, float]:
    """asv's figures, lower is better: turns that should hit and did not, by class and by cause, with the
    health check's slot takes (MISS_FIGURES); other users' ms per token and TTFT (INTERFERENCE_FIGURES)."""
    summary = next((r for r in records if r.role == Role.SESSION), None)
    long_tokens = summary.extra.get("long_prefill_tokens", 4096) if summary else 4096
    found = turns(records)
    missed = [t for t in found if t.should_hit and t.outcome != StepVerdict.HIT]
    causes = miss_causes(found)
    out: dict[str, float] = {
        "should hit": len(missed),
        **{name: sum(t.route == name for t in missed) for name in ROUTES},
        "with LoRA": sum(t.with_lora for t in missed),
        "without LoRA": sum(not t.with_lora for t in missed),
        **{f"cause: {name}": causes.get(name, 0) for name, _ in MISS_CAUSES},
        "health check took a conversation's slot": health_effect(records, long_tokens).took_slot,
    }
    i = interference(records, long_tokens)
    series = {"decode ms per token during": i.decode_during, "decode ms per token alone": i.decode_alone,
              "ttft ms during": i.ttft_during, "ttft ms alone": i.ttft_alone}
    for name, values in series.items():
        for q in (50, 90):
            value = i.percentile(values, q)
            out[f"{name} p{q}"] = float("nan") if value is None else value
    return out
