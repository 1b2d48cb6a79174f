"""`reusebench advise PROFILE`: profile changes that matter for prompt reuse, each with its effect.

An effect is *measured* when the change was tried on the profile's model at a small size (``TRIAL_SIZE``)
and *predicted* by the reuse model (``reusebench.reuse.expectation``) where it was not, for instance at the
profile's own sizes. Each advice says which.

- ``cache-reuse`` that the server disables on this model (an mmproj, or attention that cannot shift): both
  variants, with and without it, run the steps it could touch; the advice is to remove it when nothing changes.
  Where it is active on a hybrid it reuses stale recurrent state: the same trial shows the wrong output.
- A mid-document edit on a hybrid re-processes everything: sending the document as user messages, with
  ``checkpoint-min-step`` spacing the checkpoints at their starts, lets the server go back to the message
  before the edit. Tried at ``TRIAL_SIZE`` (the tokens and the checkpoints' size, from the server's log);
  predicted at the profile's sizes.
- ``slot-save-path`` on a hybrid: a restored slot has no checkpoints (predicted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from reusebench import records
from reusebench.capability import Capabilities
from reusebench.capability import build as build_mod
from reusebench.config import corpus, profiles
from reusebench.config.sizes import size_label
from reusebench.llama import facts
from reusebench.reuse import expectation, segments, server_inputs
from reusebench.run import launch as launch_mod
from reusebench.run import runner
from reusebench.run.progress import Lines
from reusebench.run.selection import Selection

TRIAL_SIZE = 2048
# What --cache-reuse could change: the steps whose prompt shares a prefix (or a shifted chunk) with the slot.
CACHE_REUSE_SCENARIOS = ("resend", "chunk_removed", "reask", "edit_middle")
TRIAL_MIN_STEP = 256  # user messages and checkpoint spacing at TRIAL_SIZE: 8 messages, a checkpoint every other one
# Spacings tried at the profile's sizes, smallest first: the first whose checkpoints still reach back past the edit
# within --ctx-checkpoints (the oldest are dropped when the list is full) is advised.
ADVISED_MIN_STEPS = (2048, 4096, 8192, 16384)
EDIT_AT = 0.5  # report A's mid-document edit
EDIT_TOKENS = 8
TRIAL_TIMEOUT_S = 300.0
# Predictions need token positions, not text: a two-token delimiter and a 17-token question, as the tiny corpus's.
PLACEHOLDER_DELIMITER, PLACEHOLDER_QUESTION = (10, 11), (20,) * 17


@dataclass(frozen=True)
class Advice:
    change: str  # what to change in the profile
    effect: str
    how: str  # "measured" (tried on the tiny model) or "predicted" (by the reuse model)

    def line(self) -> str:
        return f"- {self.change}: {self.effect} [{self.how}]"


Say = Callable[[str], None]


def advise(profile: profiles.Profile, *, results_dir: Path, say: Say) -> dict[str, list[Advice]]:
    """Advice per variant of `profile`, in its order."""
    found: dict[str, list[Advice]] = {}
    tried: dict[tuple[Path, int, int, int], Advice] = {}  # variants that differ only in other options share a trial
    for variant in profile.variants:
        spec = launch_mod.resolve(variant, build_mod.of(variant.binary, say), context=None)
        memory, launch = spec.memory, spec.launch
        advice = cache_reuse_advice(profile, variant, memory, launch, results_dir, say)
        if memory.needs_checkpoints and launch.ctx_checkpoints > 0:
            key = (variant.model, launch.ctx_checkpoints, launch.n_batch, launch.n_ubatch)
            if key not in tried:
                tried[key] = min_step_advice(spec, say)
            advice.append(tried[key])
        if memory.needs_checkpoints and spec.slot_save_path is not None:
            advice.append(Advice("slot-save-path", "a restored slot carries no checkpoints on this hybrid: a resend "
                                 "or re-ask after a restore re-processes everything; only a prompt that strictly "
                                 "extends the saved tokens reuses it", "predicted"))
        found[variant.name] = advice
    return found


# -- cache-reuse ---------------------------------------------------------------------------------------


def cache_reuse_advice(profile: profiles.Profile, variant: profiles.Variant, memory: server_inputs.Memory,
                       launch: server_inputs.Launch, results_dir: Path, say: Say) -> list[Advice]:
    """Try the variant with and without its --cache-reuse on the steps it could change."""
    setting = variant.option("cache-reuse")
    if not setting or (variant.number("cache-reuse") or 0) <= 0:
        return []
    change = f"cache-reuse {setting}"
    without = dataclasses.replace(variant, name=f"{variant.name} without cache-reuse",
                                  options={k: v for k, v in variant.options.items() if k != "cache-reuse"})
    say(f"{variant.name}: trying {change} against none at {size_label(TRIAL_SIZE)}")
    trial = dataclasses.replace(profile, variants=(variant, without))
    result = runner.run_profile(trial, Selection(sizes=(TRIAL_SIZE,), scenario_ids=CACHE_REUSE_SCENARIOS),
                                results_dir=results_dir, out=Lines(say))
    steps = compare_steps(result.records, variant.name, without.name)
    changed = [f"{step}: {a:,} vs {b:,} tokens" for step, (a, b, _, _) in steps.items() if a != b]
    wrong = [step for step, (_, _, same, same_without) in steps.items() if same is False and same_without is not False]
    tried = f"{len(steps)} steps at {size_label(TRIAL_SIZE)}"
    if server_inputs.active_cache_reuse(memory, launch) == 0:
        why = "an mmproj is loaded" if launch.multimodal else "this model's attention cache cannot shift"
        effect = (f"DISABLED on this model ({why}): remove it; " +
                  ("nothing changes" if not changed and not wrong else f"yet it changed {', '.join(changed)}") +
                  f" (re-processed tokens equal with and without it on {tried})")
        return [Advice(change, effect, "measured")]
    if wrong:
        return [Advice(change, f"active, and UNSAFE on this hybrid: {', '.join(wrong)} gave output that differs from "
                       "output computed without reuse (a shifted chunk leaves the removed tokens in the recurrent "
                       f"state); remove it ({tried})", "measured")]
    gain = ", ".join(changed) or "no step changed"
    return [Advice(change, f"active: {gain} ({tried}, with vs without)", "measured")]


def compare_steps(recorded: Sequence[records.Record], with_name: str,
                  without_name: str) -> dict[str, tuple[int, int, bool | None, bool | None]]:
    """step -> (prompt_n with, prompt_n without, output same with, output same without), for steps both measured."""
    by_variant: dict[str, dict[str, records.Record]] = {with_name: {}, without_name: {}}
    for r in recorded:
        if r.role == records.Role.MEASURE and not r.error and r.variant in by_variant and r.scenario != "first_load":
            by_variant[r.variant][f"{r.scenario}/{r.step}"] = r
    return {step: (r.prompt_n or 0, by_variant[without_name][step].prompt_n or 0, r.matches_reference,
                   by_variant[without_name][step].matches_reference)
            for step, r in by_variant[with_name].items() if step in by_variant[without_name]}


# -- checkpoint-min-step with user-message boundaries --------------------------------------------------------


def as_user_messages(document: Sequence[int], delimiter: Sequence[int], length: int) -> list[int]:
    """The document as user messages of `length` tokens, each opened by the delimiter."""
    return [t for start in range(0, len(document), length) for t in (*delimiter, *document[start:start + length])]


def edited(document: Sequence[int]) -> list[int]:
    """A few of the document's own tokens inserted at EDIT_AT."""
    at = int(len(document) * EDIT_AT)
    return [*document[:at], *document[:EDIT_TOKENS], *document[at:]]


@dataclass(frozen=True)
class EditCost:
    plain: int  # tokens an edit re-processes with the document as one block
    messages: int  # ... as user messages, with checkpoint-min-step at their starts
    checkpoints: int  # checkpoints the slot holds for the message-split prompt


def predicted_edit_cost(memory: server_inputs.Memory, launch: server_inputs.Launch, rules: Capabilities,
                        document: Sequence[int], delimiter: Sequence[int], question: Sequence[int],
                        min_step: int) -> EditCost:
    """What the reuse model expects of an edit at EDIT_AT, with and without user messages every `min_step` tokens."""
    def cost(split: bool, step: int) -> tuple[int, int]:
        model = expectation.ServerModel(memory, dataclasses.replace(launch, checkpoint_min_step=step), rules)
        before, after = ([1, *as_user_messages(d, delimiter, min_step), *delimiter, *question] if split
                         else [1, *d, *question] for d in (document, edited(document)))
        model.complete(before, user_starts=segments.user_starts(before, delimiter) if split else ())
        held = len(model.slots[model.last_slot].held.checkpoints)
        return model.complete(after, user_starts=segments.user_starts(after, delimiter) if split else ()).prompt_n, held

    plain, _ = cost(False, launch.checkpoint_min_step)
    messages, held = cost(True, min_step)
    return EditCost(plain, messages, held)


def advised_min_step(memory: server_inputs.Memory, launch: server_inputs.Launch, rules: Capabilities, size: int) -> int:
    """The smallest of ADVISED_MIN_STEPS whose message checkpoints serve an edit at EDIT_AT of a `size` document."""
    document = list(range(1000, 1000 + size))
    for step in ADVISED_MIN_STEPS:
        cost = predicted_edit_cost(memory, launch, rules, document, PLACEHOLDER_DELIMITER, PLACEHOLDER_QUESTION, step)
        if cost.messages < cost.plain // 2 + 2 * step:
            return step
    return ADVISED_MIN_STEPS[-1]


def min_step_advice(spec: launch_mod.LaunchSpec, say: Say) -> Advice:
    """Try the message-split document with checkpoint-min-step at TRIAL_SIZE; predict it at the profile's sizes."""
    variant, memory, launch, rules = spec.variant, spec.memory, spec.launch, spec.capabilities
    say(f"{variant.name}: trying user-message checkpoints (checkpoint-min-step {TRIAL_MIN_STEP}) at "
        f"{size_label(TRIAL_SIZE)}")
    measured, mib, (document, delimiter, question) = _try_min_step(spec)
    trial = predicted_edit_cost(memory, launch, rules, document, delimiter, question, TRIAL_MIN_STEP)  # the same tokens
    lines = [f"at {size_label(TRIAL_SIZE)} a one-line edit at 50% re-processes {measured.plain:,} tokens; as user "
             f"messages of {TRIAL_MIN_STEP} tokens with checkpoint-min-step {TRIAL_MIN_STEP}, {measured.messages:,} "
             f"(the model predicted {trial.plain:,} and {trial.messages:,}) for {measured.checkpoints} checkpoints of "
             f"{mib:.3f} MiB per slot ({measured.checkpoints * mib:.2f} MiB)"]
    for size in variant.sizes:
        step = advised_min_step(memory, launch, rules, size)
        at = predicted_edit_cost(memory, launch, rules, list(range(1000, 1000 + size)), PLACEHOLDER_DELIMITER,
                                 PLACEHOLDER_QUESTION, step)
        lines.append(f"at {size_label(size)} with checkpoint-min-step {step} and messages of that size: "
                     f"{at.plain:,} -> {at.messages:,} tokens for {at.checkpoints} checkpoints "
                     f"(~{at.checkpoints * mib:.2f} MiB per slot; predicted)")
    return Advice("checkpoint-min-step with the document sent as user messages",
                  "; ".join(lines), f"measured at {size_label(TRIAL_SIZE)}, predicted at the profile's sizes"
                  if variant.sizes else "measured")


def _try_min_step(spec: launch_mod.LaunchSpec) -> tuple[EditCost, float, tuple[list[int], list[int], list[int]]]:
    """The edit on the real server, document as one block and as user messages; one checkpoint's MiB; and the
    document, delimiter and question tokens it sent (after BOS)."""
    options = {**spec.variant.options, "checkpoint-min-step": TRIAL_MIN_STEP, "ctx-size": 2 * TRIAL_SIZE + 2048}
    trial = dataclasses.replace(spec.variant, options=options)
    handle = launch_mod.resolve(trial, spec.build, context=None).server(
        call_timeout_s=TRIAL_TIMEOUT_S)
    try:
        client = handle.start().client
        text = corpus.build_corpus(corpus.load_spec("tiny-words"), client, TRIAL_SIZE)
        document = client.tokenize(text.document)
        question = client.tokenize(text.questions[0])
        delimiter = client.tokenize(facts.CHATML_USER_START)
        bos = client.tokenize("", add_special=True)
        delimiters = facts.message_delimiters()

        def edit_cost(split: bool) -> tuple[int, list[float]]:
            before, after = ([*bos, *as_user_messages(d, delimiter, TRIAL_MIN_STEP), *delimiter, *question]
                             if split else [*bos, *d, *question] for d in (document, edited(document)))
            extra = delimiters if split else None
            mark = handle.mark()
            client.complete(before, n_predict=1, extra=extra)
            sizes = [float(e.fields["size_mib"]) for e in handle.events_since(mark) if e.kind == "checkpoint_created"]
            return client.complete(after, n_predict=1, extra=extra).prompt_n, sizes

        plain, _ = edit_cost(False)
        messages, sizes = edit_cost(True)
    finally:
        handle.close()
    return EditCost(plain, messages, len(sizes)), max(sizes, default=0.0), (document, delimiter, question)


def render(advice: dict[str, list[Advice]]) -> str:
    return "\n\n".join(f"{variant}:\n" + ("\n".join(a.line() for a in items) or "- nothing to change")
                       for variant, items in advice.items())
