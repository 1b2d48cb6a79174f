"""Does the reuse model agree with the real server? Every scenario, on every tiny profile, under option sets.

``reusebench agreement`` runs the catalogue on each profile once per option set (a profile extending the
shipped one with those options, named ``PROFILE+OPTION=VALUE``) and size, then counts the measured steps
whose ``prompt_n`` the model (``reusebench.reuse.expectation``) predicted within the tolerance of
``records.EXPECTED_TOLERANCE``. Every disagreement is listed with both causes. ``--records`` tabulates runs
already recorded, so the table can be rebuilt without running anything.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml
from tabulate import tabulate

from reusebench import records
from reusebench.config import profiles
from reusebench.config.sizes import size_label
from reusebench.run import runner
from reusebench.run.selection import Selection
from reusebench.run.session import OnFailure

# The tiny model profiles run the whole catalogue; tiny-lora, tiny-lora-llama and tiny-sleep add the two
# scenarios that need a LoRA or sleep (lora_swap, after_sleep), which do not apply to the others, and tiny-probe
# the health-check probe with 4 unified slots and without a RAM cache.
TINY_PROFILES = ("tiny-qwen35", "tiny-nemotron_h", "tiny-granitehybrid", "tiny-granitehybrid-longmem", "tiny-glm",
                 "tiny-gemma3", "tiny-llama", "tiny-lora", "tiny-lora-llama", "tiny-sleep", "tiny-probe")
DEFAULT_SIZES = (2048, 8192)
# The three worlds the model is checked in: the pinned defaults; one checkpoint per slot (a re-ask loses the one
# at 4 + n_ubatch before the end); and user-message checkpoints close together (the chat turns' boundaries).
OPTION_SETS: dict[str, dict[str, int]] = {
    "defaults": {},
    "ctx-checkpoints=1": {"ctx-checkpoints": 1},
    "checkpoint-min-step=64": {"checkpoint-min-step": 64},
}
SEPARATOR = "+"  # between a shipped profile's name and its option set's in a derived profile's name


def derived_profile(directory: Path, profile: str, option_set: str) -> Path:
    """A profile file extending `profile` with the options of `option_set`; the defaults are the profile itself."""
    path = directory / f"{profile}{SEPARATOR}{option_set}.yaml"
    options = OPTION_SETS[option_set]
    body = {"description": f"{profile} with {option_set}", "extends": profile, **({"options": options} if options else {})}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def split_profile(name: str) -> tuple[str, str]:
    """(shipped profile, option set) of a derived profile's name."""
    profile, _, option_set = name.partition(SEPARATOR)
    return profile, option_set or "defaults"


@dataclass(frozen=True)
class Tally:
    profile: str
    option_set: str
    size: int
    agree: int
    total: int


def measured_steps(recorded: Iterable[records.Record]) -> list[records.Record]:
    return [r for r in recorded if r.role == records.Role.MEASURE and not r.error and r.expected is not None]


def agrees(r: records.Record) -> bool:
    return abs(records.deviation(r) or 0) <= records.EXPECTED_TOLERANCE


def tally(recorded: Iterable[records.Record]) -> list[Tally]:
    """Agreements per profile x option set x size, in the order first seen."""
    counts: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in measured_steps(recorded):
        count = counts[(*split_profile(r.profile), r.size)]
        count[0] += agrees(r)
        count[1] += 1
    return [Tally(profile, option_set, size, agree, total) for (profile, option_set, size), (agree, total)
            in counts.items()]


@dataclass(frozen=True)
class NotRun:
    """A profile variant under an option set that this build cannot run (``profiles.not_runnable``): n/a."""

    profile: str
    variant: str
    reason: str


def render(recorded: Sequence[records.Record], not_run: Sequence[NotRun] = ()) -> str:
    """The agreement table (model x option set, sizes across), its total, every variant the build cannot run with
    why, and every disagreement."""
    tallies = tally(recorded)
    sizes = sorted({t.size for t in tallies})
    rows: dict[tuple[str, str], dict[int, Tally]] = {}
    for t in tallies:
        rows.setdefault((t.profile, t.option_set), {})[t.size] = t
    table = [[profile, option_set, *(f"{by[s].agree}/{by[s].total}" if s in by else "" for s in sizes)]
             for (profile, option_set), by in rows.items()]
    agree, total = sum(t.agree for t in tallies), sum(t.total for t in tallies)
    lines = [tabulate(table, ["profile", "option set", *map(size_label, sizes)], tablefmt="github"),
             "", f"agree: {agree} of {total} measured steps (tolerance {records.EXPECTED_TOLERANCE} tokens)"]
    if not_run:
        lines.append(f"n/a on this build: {len(not_run)} profile variant(s), not run:")
        lines += [f"- {n.profile} [{n.variant}]: {n.reason}" for n in not_run]
    failed = [f"- {r.session}: {failure}" for r in recorded if r.role == records.Role.SESSION
              for failure in r.extra.get("failures", [])]
    if failed:
        lines += [f"failed, their steps not counted: {len(failed)}", *failed]
    steps = measured_steps(recorded)
    # Measured: the output differed from the no-reuse reference, or the server reused more than any prefix computed
    # under the request's LoRA (the session's history; a LoRA's effect can stay within the logprob tolerance).
    # A step neither verified nor flagged (--no-verify) is not counted either way.
    checked = [r for r in steps if r.matches_reference is not None or r.extra.get("foreign_reused")]
    predicted = {id(r) for r in checked if r.extra.get("expected_wrong_output")}
    wrong = {id(r) for r in checked if r.matches_reference is False or r.extra.get("foreign_reused")}
    lines.append(f"wrong output or foreign reuse, on {len(checked)} checked steps: predicted {len(predicted)}, "
                 f"measured {len(wrong)}, both {len(predicted & wrong)}")
    lines += [f"- {'predicted, not measured' if id(r) in predicted else 'measured, not predicted'}: "
              f"{r.profile} [{r.variant}] @ {size_label(r.size)} {r.scenario}/{r.step}"
              for r in checked if (id(r) in predicted) != (id(r) in wrong)]
    differing = [r for r in steps if not agrees(r)]
    if differing:
        lines += ["", "disagreements:"]
        lines += [f"- {r.profile} [{r.variant}] @ {size_label(r.size)} {r.scenario}/{r.step}: expected {r.expected:,} "
                  f"({r.cause_expected}), measured {r.prompt_n:,} ({(r.cause or {}).get('summary', '?')})"
                  for r in differing]
    return "\n".join(lines)


def run(profile_names: Sequence[str], option_sets: Sequence[str], sizes: Sequence[int], *, results_dir: Path,
        verify: bool = True, out: TextIO) -> tuple[list[records.Record], list[NotRun]]:
    """Run every scenario of each profile under each option set at each size; all their records, and the variants
    the build cannot run (an option it lacks, a model architecture it does not know). Without `verify`, no output
    is compared with a no-reuse reference (about half the prefill of a hybrid session), so the wrong outputs are
    neither measured nor counted."""
    recorded: list[records.Record] = []
    not_run: list[NotRun] = []
    with tempfile.TemporaryDirectory(prefix="reusebench-agreement-") as directory:
        for name in profile_names:
            for option_set in option_sets:
                path = derived_profile(Path(directory), name, option_set)
                loaded = profiles.load_for_build(path)
                profile, runnable, skipped = loaded.profile, loaded.runnable, loaded.skipped
                not_run += [NotRun(profile.name, variant, reason) for variant, reason in skipped.items()]
                if not runnable:
                    print(f"{profile.name}: n/a on this build ({'; '.join(sorted(set(skipped.values())))})", file=out)
                    continue
                chosen = Selection(tuple(runnable), tuple(sizes), verify=verify, on_failure=OnFailure.CONTINUE)
                result = runner.run_profile(profile, chosen, results_dir=results_dir, out=out)
                recorded += result.records
                print(render(result.records), file=out, flush=True)
    return recorded, not_run


def option_sets_named(names: Sequence[str] | None) -> list[str]:
    unknown = sorted(set(names or ()) - set(OPTION_SETS))
    if unknown:
        raise ValueError(f"unknown option set(s) {', '.join(unknown)}; known: {', '.join(OPTION_SETS)}")
    return list(names or OPTION_SETS)
