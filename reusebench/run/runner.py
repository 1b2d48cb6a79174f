"""Run a profile: every variant x size as one session (or N repeated first loads), all records in one run directory.

Used by ``reusebench run`` and by the asv suite's ``setup_cache``. A run never
reuses a directory, so a second run cannot overwrite the first.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TextIO

from reusebench import records
from reusebench.budget import prefill_budgets
from reusebench.capability import build as build_mod
from reusebench.capability.build import Build
from reusebench.config import corpus, profiles, scenarios
from reusebench.config.sizes import size_label
from reusebench.llama import gguf_check
from reusebench.machine import spread
from reusebench.machine.gpu import GpuSampler
from reusebench.records import RunKind
from reusebench.reuse import server_inputs
from reusebench.run import launch, plan, provenance
from reusebench.run import selection as selection_mod
from reusebench.run.launch import LaunchSpec
from reusebench.run.opening import open_run
from reusebench.run.selection import Chosen, Repeats, Selection
from reusebench.run.session import RunShared, Session, SessionResult, session_name


@dataclass(frozen=True)
class ProfileResult:
    run_id: str
    run_dir: Path
    records: list[records.Record]
    failed_sessions: int

    @property
    def records_path(self) -> Path:
        return self.run_dir / "records.jsonl"


SamplerFactory = Callable[[], GpuSampler]
# Long enough to lift a GPU out of its idle P-state and map the weights in, short against any first load.
WARM_UP_TOKENS = 512


def _warmed_first_load(s: scenarios.Steps) -> None:
    # The end of another text, without BOS: the measured load shares no prefix with it, so nothing is reused.
    s.setup("first_load", "warm-up", s.tokens(s.other, bos=False)[-WARM_UP_TOKENS:])
    scenarios.first_load(s)


WARMED_FIRST_LOAD = dataclasses.replace(scenarios.FIRST_LOAD, title="cold prefill after a warm-up on another text",
                                        run=_warmed_first_load)


def run_profile(profile: profiles.Profile, selection: Selection = selection_mod.ALL, *, results_dir: Path,
                sampler_factory: SamplerFactory = GpuSampler, out: TextIO | None = None) -> ProfileResult:
    """Run what `selection` chose of `profile` and return what was recorded, all in one new run directory.

    `sampler_factory` makes the run's GPU sampler (tests pass one over a fake NVML). Prints the plan first
    (``plan.render_plan``), an estimate of the time left after each first load, and ends with one prefill-budget
    line per session.
    """
    out = out or sys.stderr  # looked up now: a redirected stderr (tests, redirect_stderr) is honoured
    chosen = selection_mod.sessions(profile, selection)  # refused now, before anything starts
    refuse_beyond_context([(variant, size, size) for variant, size, _ in chosen])
    corpus_spec = corpus.load_spec(selection.corpus_name or profile.corpus)
    builds = probe_binaries([variant for variant, _, _ in chosen], out)
    sessions = resolve_sessions(chosen, builds, selection)
    planned = plan_sessions(sessions, corpus_spec, repeats=selection.repeats)
    refuse_beyond_context(_longest(sessions, planned))
    names = list(dict.fromkeys(variant.name for variant, _, _ in chosen))
    stamp = provenance.stamp(profile, names, {path: build.capabilities for path, build in builds.items()},
                             corpus_spec.name, kind=RunKind.SCENARIOS,
                             launches={s.spec.variant.name: s.spec.args for s in sessions},
                             selection={"sizes": sorted({s.size for s in sessions}),
                                        "scenarios": list(dict.fromkeys(sc.id for s in sessions for sc in s.scenarios)),
                                        "verify": selection.verify, "early_stop": selection.early_stop,
                                        "repeats": None if selection.repeats is None else selection.repeats.count})
    failed = 0
    with open_run(results_dir, stamp) as (run, writer), sampler_factory() as sampler:
        print(f"run {run.run_id}: profile {profile.name}, {len(names)} variant(s), corpus {corpus_spec.name}, "
              f"records -> {run.records_path}", file=out)
        print(plan.render_plan(planned), file=out, flush=True)
        if sampler.unavailable:
            print(f"GPU state not recorded ({sampler.unavailable}): expected on a machine without an NVIDIA GPU",
                  file=out)
        shared = RunShared(writer, run, sampler, out, plan.Estimate(planned, out))

        def session(spec: LaunchSpec, size: int, selected: Sequence[scenarios.Scenario],
                    repeat: int | None = None) -> Session:
            return Session(spec, size, corpus_spec, shared, selected=selected, repeat=repeat,
                           on_failure=selection.on_failure)

        for spec, size, selected in sessions:
            if selection.repeats is None:
                failed += session(spec, size, selected).run().error is not None
            else:
                failed += _repeat_first_load(functools.partial(session, spec, size, _repeated(selection.repeats)),
                                             selection.repeats, out)
    kept = records.read_records(run.records_path)
    for budget in prefill_budgets(kept):
        print(budget.line(), file=out)
    return ProfileResult(run.run_id, run.path, kept, failed)


class PlannedSession(NamedTuple):
    """One session: its launch, its size, its scenarios."""

    spec: LaunchSpec
    size: int
    scenarios: list[scenarios.Scenario]


def resolve_sessions(chosen: Sequence[Chosen], builds: Mapping[Path, Build],
                     selection: Selection) -> list[PlannedSession]:
    """Each session's launch, resolved once (``launch.resolve``) on its binary's Build: the plan and the session
    take it."""
    return [PlannedSession(launch.resolve(variant, builds[variant.binary.path], context=launch.session_context(size),
                                          verify=selection.verify, early_stop=selection.early_stop), size, selected)
            for variant, size, selected in chosen]


def probe_binaries(variants: Sequence[profiles.Variant], out: TextIO) -> dict[Path, Build]:
    """Each binary's Build (``capability.build.of``: its capabilities cached, else probed now), said once each."""
    found: dict[Path, Build] = {}
    for variant in variants:
        path = variant.binary.path
        if path not in found:
            started = time.monotonic()
            found[path] = build_mod.of(variant.binary, lambda message: print(f"  {message}", file=out, flush=True))
            rules = found[path].capabilities
            took = f" in {time.monotonic() - started:.1f} s" if rules.how == "probed" else ""
            print(f"llama-server {path}{took}: {rules.label()} (each rule: `reusebench probe {path}`)", file=out,
                  flush=True)
    return found


def plan_sessions(sessions: Sequence[PlannedSession], corpus_spec: corpus.CorpusSpec, *,
                  repeats: Repeats | None = None) -> list[plan.SessionPlan]:
    """Each session's planned calls (``plan.plan_session``), repeated sessions one plan each; a corpus with images
    on a variant without an mmproj is refused first."""
    if corpus_spec.images is not None:
        for spec, *_ in sessions:
            if spec.variant.mmproj is None:
                raise profiles.ProfileError(
                    f"{corpus_spec.path}: images: the corpus's documents carry images, and {spec.variant.profile} "
                    f"[{spec.variant.name}] loads no mmproj to read them (set `mmproj:` in the profile, or choose a "
                    "corpus without images)")
    first_load = _repeated(repeats) if repeats is not None else []
    numbers = [None] if repeats is None else range(1, repeats.count + 1)
    return [plan.plan_session(spec, size, selected if repeats is None else first_load, corpus_spec,
                              name=session_name(spec.variant, size, number))
            for spec, size, selected in sessions for number in numbers]


def plan_profile(profile: profiles.Profile, selection: Selection = selection_mod.ALL) -> list[plan.SessionPlan]:
    """What `run_profile` with this selection would send, without sending anything (``--dry-run``): by each
    binary's rules, on the model's memory as its binary builds it (each learned by short starts the first time,
    then kept)."""
    return planned_sessions(profile, selection)[1]


def planned_sessions(profile: profiles.Profile, selection: Selection
                     ) -> tuple[list[PlannedSession], list[plan.SessionPlan]]:
    """The sessions (each resolved launch, size and scenarios) and ``plan_profile``'s plans of them (one per
    repeat)."""
    chosen = selection_mod.sessions(profile, selection)
    refuse_beyond_context([(variant, size, size) for variant, size, _ in chosen])
    by_path = {variant.binary.path: variant.binary for variant, _, _ in chosen}  # each binary's Build, once
    sessions = resolve_sessions(chosen, {path: build_mod.of(binary) for path, binary in by_path.items()}, selection)
    planned = plan_sessions(sessions, corpus.load_spec(selection.corpus_name or profile.corpus),
                            repeats=selection.repeats)
    refuse_beyond_context(_longest(sessions, planned))
    return sessions, planned


def refuse_beyond_context(sessions: Sequence[tuple[profiles.Variant, int, int]]) -> None:
    """A session whose longest prompt, with the tokens it generates, does not fit a slot is refused before any
    server starts, with both numbers: llama-server caps a slot at the model's trained context (its GGUF's
    ``context_length``) and at its share of ``--ctx-size``, and answers a longer prompt with HTTP 400. Each
    session is (variant, size, its longest prompt): the size itself before the plan, the plan's longest after."""
    for variant, size, longest in sessions:
        needed = longest + variant.n_predict
        where = f"{variant.profile} [{variant.name}] at {size_label(size)}"
        limit = gguf_check.trained_context(variant.model)
        if limit and needed > limit:
            raise profiles.ProfileError(
                f"{where}: its longest prompt and output take {needed:,} tokens, beyond {variant.model.name}'s "
                f"trained context of {limit:,} (llama-server caps a slot there): choose a size up to "
                f"{limit - (needed - size):,} tokens")
        if variant.option("ctx-size") is not None:
            slot = server_inputs.launch_of_options(variant.options).slot_ctx
            if needed > slot:
                raise profiles.ProfileError(
                    f"{where}: its longest prompt and output take {needed:,} tokens, beyond the {slot:,} of a "
                    f"slot that options.ctx-size {variant.option('ctx-size')} gives")


def _longest(sessions: Sequence[PlannedSession], planned: Sequence[plan.SessionPlan]) -> list[tuple[
        profiles.Variant, int, int]]:
    return [(session.spec.variant, session.size, max((c.prompt_tokens for c in p.calls), default=0))
            for session, p in zip(sessions, planned)]


def _repeated(repeats: Repeats) -> list[scenarios.Scenario]:
    """What each repeat runs: the first load, after a warm-up on another text with ``--warm-up``."""
    return [WARMED_FIRST_LOAD] if repeats.warm_up else scenarios.select(["first_load"])


def _repeat_first_load(session: Callable[[int], Session], repeats: Repeats, out: TextIO) -> int:
    """Run the repeats of one variant x size, one progress line each; returns how many failed."""
    failed = 0
    for number in range(1, repeats.count + 1):
        if repeats.idle_gap_s:
            print(f"idling {repeats.idle_gap_s:g} s before repeat {number}/{repeats.count}", file=out, flush=True)
            time.sleep(repeats.idle_gap_s)
        current = session(number)
        result = current.run()
        failed += result.error is not None
        print(f"repeat {number}/{repeats.count} [{current.name}]: {_repeat_state(result)}", file=out, flush=True)
    return failed


def _repeat_state(result: SessionResult) -> str:
    measured = spread.session_first_load(result.records)
    if result.error or measured is None:
        return f"failed: {result.error or 'nothing measured'}"
    return "; ".join(f"{name}: {cell}" for name, cell in zip(spread.STATE_COLUMNS, spread.state_cells(measured)))
