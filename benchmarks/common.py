"""What every benchmark module shares: the selection, the one session per commit, and figure lookup.

asv runs ``SessionFigures.setup_cache`` once per commit (every class inherits the
same function, and asv keys its cache by the function's module and line), so one
reusebench run feeds all ``track_*`` benchmarks. The figures are seconds and
token counts only: asv assumes lower is better, so rates would read backwards.

What the suite measures comes from its REUSEBENCH_ASV_* variables, read by
``reusebench.config.asv_selection`` alone (the nightly's plan reads them there too); every
variable is in docs/environment.md. Where asv built llama-server for a commit, every profile runs
on that build (``load_profile``'s ``binary``). ``REUSEBENCH_ASV_RECORDS``, a ``records.jsonl`` of a
``reusebench run`` to publish instead of measuring again (``make bench``: one measurement,
shown live, then tracked), replaces the selection with those records'. It is refused (one
line) where asv built the environment (the nightly: every commit would get the same
figures), and when the run's stamp (``run.json``: reusebench commit, profile content,
binaries) differs from now.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from asv_runner.benchmarks.mark import SkipNotImplemented

from reusebench import records
from reusebench.config import asv_selection, profiles, scenarios, sizes
from reusebench.llama import asv_install
from reusebench.machine import host
from reusebench.run import provenance, runner
from reusebench.run.selection import Selection

REPO = Path(__file__).resolve().parents[1]
INSTALLED_FILE = asv_install.INSTALLED_FILE  # written into asv's environment by `reusebench build --asv-env`

# Every measured step of the scenario catalogue, as "scenario/step", in catalogue order, from the
# scenarios' own declarations (asv needs its parameters before anything runs). Their values key the
# history: tests/test_scenarios.py pins the list, so renaming one is as deliberate as bumping a `version`.
STEPS = scenarios.MEASURED_STEPS
FIRST_LOAD = STEPS[0]


def installed_binary() -> Path | None:
    """The llama-server asv built for this commit (asv.llama.conf.json), else None.

    Only environments that asv builds into set ASV_ENV_DIR; the embedded default
    (environment_type "existing") sees no ASV_* variables.
    """
    env_dir = os.environ.get("ASV_ENV_DIR")
    if env_dir is None:
        return None
    info_path = Path(env_dir) / INSTALLED_FILE
    if not info_path.is_file():
        # Falling back to the bundled binary would give every commit the same figures.
        raise RuntimeError(f"asv built this environment, but {info_path} is missing: the config's install_command "
                           "must be `python -m reusebench build --tree {build_dir} --commit {commit} --asv-env {env_dir}`")
    info = json.loads(info_path.read_text())
    commit = os.environ.get("ASV_COMMIT")
    if commit and info["commit"] != commit:
        raise RuntimeError(f"{info_path}: holds the llama-server of {info['commit']}, but asv runs {commit}")
    return Path(info["binary"])


def _load_profile() -> profiles.Profile:
    """The whole profile, unchecked (setup_cache only: it resolves binaries and models), every variant on the
    llama-server asv built for this commit where it built one: a profile's own binary would give every commit the
    same figures."""
    return profiles.load_profile(SELECTION.profile, check_binary=False, binary=installed_binary())


class ReplayRefused(RuntimeError):
    """REUSEBENCH_ASV_RECORDS names records asv must not publish as this commit's figures."""


def replay(records_file: Path) -> tuple[profiles.Profile, list[records.Record]]:
    """The profile and records of a `reusebench run` to publish, when they are what asv benchmarks now."""
    def refused(why: str) -> ReplayRefused:
        return ReplayRefused(f"REUSEBENCH_ASV_RECORDS={records_file}: refused: {why}")

    if "ASV_ENV_DIR" in os.environ:  # only environments asv builds set it: the nightly over llama.cpp commits
        raise refused("asv built this environment, and every commit it builds would get this one run's figures; "
                      "unset REUSEBENCH_ASV_RECORDS to measure each commit")
    stamp = provenance.read(records_file.parent)
    if stamp is None:
        raise refused(f"no {provenance.STAMP_FILE} beside it says what it was measured with; run it again")
    replayed = records.read_records(records_file)
    if not replayed:
        raise refused("it holds no records")
    profile = profiles.load_profile(stamp.profile, check_binary=False)
    now = provenance.stamp(profile, [v.name for v in profile.variants if v.name in stamp.binaries])
    differences = provenance.differences(stamp, now)
    if differences:
        raise refused(f"it was measured with {'; '.join(differences)}")
    return profile, replayed


# At import (asv's discovery) only what the parameters need: the profile's outline (its files, no binary or model),
# or, when replaying, the records file itself. The checks and the full profile wait for setup_cache.
RECORDS_FILE = asv_selection.records_file()
if RECORDS_FILE is not None:
    _REPLAYED = records.read_records(RECORDS_FILE) if RECORDS_FILE.is_file() else []
    SIZE_TOKENS = sorted({r.size for r in _REPLAYED})
    VARIANTS = list(dict.fromkeys(r.variant for r in _REPLAYED))
    SCENARIOS = list(dict.fromkeys(r.scenario for r in _REPLAYED))
    _STAMP = provenance.read(RECORDS_FILE.parent)
    OUTLINE = profiles.outline(_STAMP.profile) if _STAMP is not None else None
else:
    SELECTION = asv_selection.from_env()
    OUTLINE = profiles.outline(SELECTION.profile)
    SIZE_TOKENS = list(SELECTION.sizes)
    VARIANTS = list(SELECTION.variants)
    SCENARIOS = list(SELECTION.scenarios)
SIZES = [sizes.size_label(tokens) for tokens in SIZE_TOKENS]  # asv parameter values: "32K", "128K"
# Steps after the cold first load, of the selected scenarios only: a narrowed run has no failures to show.
REUSE_STEPS = [step for step in STEPS[1:] if step.split("/")[0] in SCENARIOS]
REPEAT = 1 if RECORDS_FILE is not None else SELECTION.repeat
FULL_PREFILLS = RECORDS_FILE is None and SELECTION.full_prefills


def results_dir() -> Path:
    """Where every benchmark's runs are kept: $REUSEBENCH_RESULTS (the nightly's), else the repository's results."""
    return Path(os.environ.get("REUSEBENCH_RESULTS", REPO / "results"))


def whole_profile() -> profiles.Profile:
    """The profile the figures come from, loaded whole (setup_cache only): the replayed run's, else the selected."""
    return replay(RECORDS_FILE)[0] if RECORDS_FILE is not None else _load_profile()


def _measure() -> dict[str, Any]:
    """Run the selected sessions REPEAT times (or take REUSEBENCH_ASV_RECORDS); figures per (variant, size) and step."""
    if RECORDS_FILE is not None:
        _, replayed = replay(RECORDS_FILE)
        return summarise(replayed, [str(RECORDS_FILE)])
    loaded = profiles.load_for_build(SELECTION.profile, VARIANTS, binary=installed_binary())
    profile, runnable, skipped = loaded.profile, loaded.runnable, loaded.skipped
    for name, why in skipped.items():
        print(f"benchmarks: variant {name} does not apply to this build: {why}", file=sys.stderr)
    chosen = Selection(tuple(runnable), tuple(SIZE_TOKENS), tuple(SCENARIOS), early_stop=not FULL_PREFILLS)
    runs = [runner.run_profile(profile, chosen, results_dir=results_dir(), out=sys.stderr)
            for _ in range(REPEAT if runnable else 0)]
    cache = summarise([r for run in runs for r in run.records], [str(run.records_path) for run in runs],
                      failed_sessions=sum(run.failed_sessions for run in runs))
    return {**cache, "not_applicable": skipped}


GPU_STATE = ("start_temperature_c", "sm_clock_mean_mhz", "throttled_fraction", "idle_before_s")


def _image_figures(rs: list[records.Record]) -> dict[str, float]:
    """The images after what each step kept (re-processed whole) and their tokens, those the log shows encoded,
    and the seconds the encodes took: medians over repeats, n/a without images."""
    with_images = [r for r in rs if r.extra.get("image_spans")]
    ran = [r for r in with_images if r.prompt_ms is not None]  # a step stopped at its count encoded nothing yet
    return {
        "image_tokens_reprocessed": _median_known(sum(records.images_reprocessed(r)) for r in with_images),
        "images_encoded": _median_known((r.cause or {}).get("images_encoded") for r in ran),
        "image_encode_seconds": _median_known(((r.cause or {}).get("image_encode_ms") or 0.0) / 1000
                                              for r in ran if r.cause is not None),
    }


def _median_known(values: Iterable[float | None]) -> float:
    """Median of the known values; NaN, which asv shows as n/a (None would read "failed"), when none is known."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else math.nan


def summarise(measured: list[records.Record], records_paths: list[str],
              failed_sessions: int | None = None) -> dict[str, Any]:
    """Figures for asv from a run's records: medians over repeats for every (variant, size, step).

    `failed_sessions`: how many sessions the run counted as failed, those that failed before writing a
    record included; None for records alone (a replay), which count a session failed as the run did.
    """
    by_step: dict[tuple[str, str, str], list[records.Record]] = defaultdict(list)
    sessions: dict[tuple[str, str], tuple[str, str]] = {}  # (run id, session) -> (variant, size)
    for r in measured:
        key = sessions.setdefault((r.run_id, r.session), (r.variant, sizes.size_label(r.size)))
        if r.role == records.Role.MEASURE and not r.error:
            by_step[(*key, f"{r.scenario}/{r.step}")].append(r)
    failures = records.failed_sessions(measured)
    errors = {sessions[session]: why for session, why in failures.items()}
    unknown = sorted({step for _, _, step in by_step} - set(STEPS))
    if unknown:
        print(f"benchmarks/common.py: steps measured but not tracked (declare them in their scenario's `measures`): "
              f"{unknown}", file=sys.stderr)
    figures: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, rs in by_step.items():
        # a step stopped once its count was known has no seconds: n/a, not 0
        seconds = [r.prompt_ms / 1000 for r in rs if r.prompt_ms is not None]
        figures[key] = {
            "prefill_seconds": _median_known(seconds),
            "prefill_seconds_min": min(seconds, default=math.nan),  # the spread over repeats (benchmarks/gpu_state.py)
            "prefill_seconds_max": max(seconds, default=math.nan),
            "repeats": len(rs),
            "ttft_seconds": _median_known(None if r.ttft_ms is None else r.ttft_ms / 1000 for r in rs),
            "reprocessed_tokens": statistics.median(r.prompt_n or 0 for r in rs),
            "excess_over_ideal": statistics.median(r.excess or 0 for r in rs),
            # measured minus what the reuse model predicts: 0 while the build behaves as its rules say
            "deviation_from_expected": _median_known(records.deviation(r) for r in rs),
            "mismatch": max(int(r.matches_reference is False) for r in rs),  # any repeat that differed
            # speculative decoding: n/a for a variant that does not speculate (benchmarks/speculation.py)
            "drafted_tokens": _median_known(r.extra.get("draft_n") for r in rs),
            "accepted_tokens": _median_known(r.extra.get("draft_accepted") for r in rs),
            "rolled_back_drafts": _median_known(records.drafts_rolled_back(r) for r in rs),
            "decode_seconds": _median_known(None if r.predicted_ms is None else r.predicted_ms / 1000 for r in rs),
            # images in the prompt: n/a for a step that sent none (benchmarks/images.py)
            **_image_figures(rs),
            # the machine state beside the figures (benchmarks/gpu_state.py)
            **{name: _median_known((r.gpu or {}).get(name) for r in rs) for name in GPU_STATE},
            "model_page_cache_fraction": _median_known((r.host or {}).get("model_page_cache_fraction") for r in rs),
            # 1: other work loaded the machine before the step, so its seconds are noise (compare does not judge them)
            "busy": max(int(host.under_load(r.host) is not None) for r in rs),
        }
    # A session can fail before it writes a record (e.g. a profile that names a missing binary): then no
    # missing figure can be taken for a scenario that did not apply.
    known = failed_sessions is None or failed_sessions <= len(failures)
    clean = set(sessions.values()) - set(errors) if known else set()
    return {"figures": figures, "clean_sessions": clean, "errors": errors, "records": records_paths}


def figure(cache: dict[str, Any], size: str, variant: str, step: str, name: str) -> float:
    """One figure. Missing: skipped (n/a) when the session ran cleanly or the variant does not apply to this
    build (an option it lacks, a model architecture it does not know), else a failure that says why."""
    inapplicable = cache.get("not_applicable", {}).get(variant)
    if inapplicable:
        raise SkipNotImplemented(f"{variant} does not apply to this build: {inapplicable}")
    found = cache["figures"].get((variant, size, step))
    if found is not None:
        return found[name]
    session = (variant, size)
    if session in cache["clean_sessions"]:
        # e.g. after_sleep on a variant without sleep-idle-seconds: the session says why on stderr.
        raise SkipNotImplemented(f"{step} does not apply to {variant} @ {size}")
    why = cache["errors"].get(session, "a session stopped early (its error is in the asv log)")
    raise RuntimeError(f"no {name} for {variant} @ {size} {step}: {why}; records: {', '.join(cache['records'])}")


Read = Callable[[dict[str, Any], str, str, str], float]  # (cache, size, variant, step) -> the figure


def track(value: str | Read, step: str | None = None, *, unit: str | None = None,
          doc: str | None = None) -> Callable[..., float]:
    """The one factory of ``track_*`` methods: figure `value` (a name in ``summarise``'s figures, or a function
    of the cache) of ``step`` (params: size, variant), or, when ``step`` is None, of the class's step parameter
    (params: size, variant, step).

    ``unit``, when given, is the method's own and wins over the class's; ``doc`` is its description.
    """
    read: Read = value if callable(value) else (lambda cache, size, variant, s: figure(cache, size, variant, s, value))
    if step is None:
        def track_figure(self, cache, size, variant, step):
            return read(cache, size, variant, step)
    else:
        def track_figure(self, cache, size, variant):
            return read(cache, size, variant, step)
    track_figure.__doc__ = doc
    if unit is not None:
        track_figure.unit = unit  # type: ignore[attr-defined]
    return track_figure


class SessionFigures:
    """Base class: one reusebench run per commit, shared by every benchmark class."""

    # A 128K session on a CPU takes minutes per variant; the harness has its own
    # request timeouts, so asv's default of 60 s would only cut good runs short.
    timeout = 6 * 3600

    def setup_cache(self) -> dict[str, Any]:
        return _measure()
