"""Hypothesis strategies for the fuzzer's cases: a launch of the options that decide reuse, and serial traffic.

Every choice lists llama-server's default (or the plainest value) first, so a shrunk case keeps only the options
and steps a difference needs. Prompts are built from the ones before them, as users build theirs: a new document
(perhaps sharing the start of an earlier one), the same prompt again, a chat that grows by its answer and a new
turn, an edit inside, a part removed or put in, a re-ask that keeps a prefix and asks something else, and slot
saves, restores and erases.
"""

from __future__ import annotations

from collections.abc import Collection

from hypothesis import strategies as st

from reusebench.config.options import OptionValue
from reusebench.fuzz.case import FAMILIES, WINDOWED, Case, Runs, Send, SlotAction, Step
from reusebench.llama.facts import AUTO_SLOTS
from reusebench.reuse import swa
from reusebench.trace.prompts import ANSWER

BLOCK_TOKENS = 16
MAX_BLOCKS = 48  # a prompt of up to 768 tokens: past a small ubatch, a 32-token window, a 128-token one
MAX_STEPS = 10
MAX_PREDICT = 8  # below a block: an answer is one run
KINDS = ("new", "resend", "grow", "edit", "reask", "drop", "insert", "save", "restore", "erase")
SLOT_ACTIONS = ("save", "restore", "erase")


def launch_options(family: str, listed: Collection[str]) -> st.SearchStrategy[dict[str, OptionValue]]:
    """The options of one launch (without --ctx-size, which follows from the traffic), of those the build's
    --help lists (`listed`: an older build lacks some)."""

    @st.composite
    def draw_options(draw: st.DrawFn) -> dict[str, OptionValue]:
        options: dict[str, OptionValue] = {}

        def pick(name: str, values: list[OptionValue | None]) -> None:
            value = draw(st.sampled_from(values if name in listed else [None]), label=name)
            if value is not None:
                options[name] = value

        pick("parallel", [1, 2, 3, None])  # None: auto, 4 slots with a unified KV cache
        if "parallel" in options:
            pick("kv-unified", [None, True])
        pick("cache-ram", [None, 0, -1, 1, 2, 4])
        pick("no-cache-idle-slots", [None, True])
        pick("ctx-checkpoints", [None, 0, 1, 2, 3, 8])
        pick("checkpoint-min-step", [None, 0, 16, 64, 256])
        pick("slot-prompt-similarity", [None, 0.0, 0.5, 0.9])
        pick("cache-reuse", [None, 8, 32])
        ubatch = draw(st.sampled_from([512, 32, 64, 128]), label="ubatch-size")
        if ubatch != 512:
            options["ubatch-size"] = ubatch
            options["batch-size"] = ubatch * draw(st.sampled_from([4, 1, 2]), label="batch-size")
        if family in WINDOWED:
            pick("swa-full", [None, True])
        return options

    return draw_options()


def traffic(n_slots: int, slot_actions: bool) -> st.SearchStrategy[tuple[Step, ...]]:
    """Serial traffic of up to MAX_STEPS steps over `n_slots` slots."""
    kinds = KINDS if slot_actions else tuple(k for k in KINDS if k not in SLOT_ACTIONS)

    @st.composite
    def draw_traffic(draw: st.DrawFn) -> tuple[Step, ...]:
        fresh = iter(range(1, 10_000))  # block ids, new ones in order: a shrunk case reads 1, 2, 3...
        sent: list[Send] = []
        steps: list[Step] = []
        saves = 0

        def blocks(n: int) -> Runs:
            return tuple((next(fresh), BLOCK_TOKENS) for _ in range(n))

        def earlier() -> Send:
            return sent[-1 - draw(st.integers(0, len(sent) - 1), label="which earlier prompt")]

        for _ in range(draw(st.integers(1, MAX_STEPS), label="steps")):
            kind = draw(st.sampled_from(kinds if sent else ("new",)), label="step")
            if kind in SLOT_ACTIONS:
                if kind == "restore" and not saves:
                    continue
                slot = draw(st.integers(0, n_slots - 1), label="slot")
                file = draw(st.integers(0, saves - 1), label="file") if kind == "restore" else saves
                saves += kind == "save"
                steps.append(SlotAction(kind, slot, file))
                continue
            if kind == "new":
                shared: Runs = ()
                shares: bool = draw(st.booleans(), label="shares a start") if sent else False
                if shares:
                    base = earlier().runs
                    shared = base[:draw(st.integers(1, len(base)), label="shared runs")]
                runs = shared + blocks(draw(st.integers(1, MAX_BLOCKS), label="blocks"))
            elif kind == "resend":
                runs = earlier().runs
            elif kind == "grow":  # the last turn, its answer in full, and a new turn
                last = earlier()
                runs = last.runs + ((ANSWER, last.n_predict),) + blocks(draw(st.integers(1, 8), label="turn"))
            elif kind in ("edit", "drop", "insert"):  # one block inside replaced, removed (what --cache-reuse
                base = earlier().runs                     # shifts over), or a new one put in (a changed head)
                at = draw(st.integers(0, len(base) - 1), label="where")
                if kind == "drop" and len(base) < 2:
                    continue
                new = () if kind == "drop" else blocks(1)
                runs = base[:at] + new + base[at + (kind != "insert"):]
            else:  # re-ask: a prefix, cut inside a run perhaps, and another question
                base = earlier().runs
                keep = draw(st.integers(1, len(base)), label="kept runs")
                head = base[:keep]
                block, length = head[-1]
                head = head[:-1] + ((block, draw(st.integers(1, length), label="cut")),)
                runs = head + blocks(draw(st.integers(1, 4), label="question"))
            runs = _cut(runs, MAX_BLOCKS * BLOCK_TOKENS)
            if draw(st.booleans(), label="partial last block"):
                block, length = runs[-1]
                runs = runs[:-1] + ((block, draw(st.integers(1, length), label="last length")),)
            send = Send(runs, draw(st.integers(1, MAX_PREDICT), label="n_predict"))
            sent.append(send)
            steps.append(send)
        return tuple(steps)

    return draw_traffic()


def _cut(runs: Runs, limit: int) -> Runs:
    kept: list[tuple[int, int]] = []
    total = 0
    for block, length in runs:
        if total + length > limit:
            if limit > total:
                kept.append((block, limit - total))
            break
        kept.append((block, length))
        total += length
    return tuple(kept)


def n_slots(options: dict[str, OptionValue]) -> int:
    return int(options.get("parallel", AUTO_SLOTS))  # type: ignore[arg-type]


def context(options: dict[str, OptionValue], steps: tuple[Step, ...], stretch: int) -> int:
    """A --ctx-size that gives every slot room for the longest prompt and its answer (with a unified KV cache,
    room for every slot at once), times `stretch`."""
    longest = max((s.length + s.n_predict for s in steps if isinstance(s, Send)), default=1)
    return swa.pad((longest + BLOCK_TOKENS) * n_slots(options)) * stretch


def cases(family: str, listed: Collection[str], *, slot_actions: bool = True) -> st.SearchStrategy[Case]:
    """A case of `family`: a launch of the options in `listed` (a build's --help), then traffic for its slots,
    then the context it needs."""
    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)}")

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        options = draw(launch_options(family, listed))
        steps = draw(traffic(n_slots(options), slot_actions))
        options["ctx-size"] = context(options, steps, draw(st.sampled_from([1, 2]), label="context stretch"))
        return Case(family, options, steps, BLOCK_TOKENS)

    return draw_case()
