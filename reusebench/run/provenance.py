"""Where a run's figures came from: the reusebench commit, the profile's content, each variant's binary.

Every run writes this stamp beside its records (``run.json``). The asv suite's
replay of a run (``REUSEBENCH_ASV_RECORDS``) compares it with what asv is
benchmarking now and refuses figures that were measured with something else.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reusebench.capability import Capabilities
from reusebench.config import profiles
from reusebench.llama import builder
from reusebench.records import RunKind, file_sha256
from reusebench.run.launch import LaunchSpec

STAMP_FILE = "run.json"
REPO = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Stamp:
    reusebench_commit: str | None  # None when reusebench does not run from a git checkout
    reusebench_dirty: bool | None  # uncommitted changes in that checkout (the commit alone does not say the code)
    profile: str  # the profile's file
    profile_sha256: str  # of the profile's file and every file it extends, base first
    binaries: dict[str, str]  # variant name -> the build of its llama-server (``binary_build``)
    # variant name -> its binary's capabilities where builds differ (``Capabilities.to_dict``); {} before probes
    capabilities: dict[str, dict[str, Any]] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant name -> its launch options as written
    corpus: str | None = None  # the corpus spec its documents came from; None in a stamp from before it was kept
    kind: str | None = None  # RunKind; None in a stamp from before it was kept (``kind_of`` reads the records)
    launches: dict[str, list[str]] = field(default_factory=dict)  # variant name -> its resolved launch arguments
    selection: dict[str, Any] = field(default_factory=dict)  # what the command chose: sizes, scenarios, a trace

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reusebench_commit() -> tuple[str | None, bool | None]:
    """HEAD of the checkout reusebench runs from, and whether its tree has changes; (None, None) outside git."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    # an installed copy can sit inside someone else's repository: only a checkout of reusebench itself counts
    if git("rev-parse", "--show-toplevel") != str(REPO):
        return None, None
    status = git("status", "--porcelain")
    return git("rev-parse", "HEAD"), None if status is None else bool(status)


def profile_sha256(profile: profiles.Profile) -> str:
    digest = hashlib.sha256()
    for path in profiles.profile_files(profile.path):
        content = path.read_bytes()
        digest.update(f"{len(content)}\n".encode())  # length first: two files never read as one
        digest.update(content)
    return digest.hexdigest()


def binary_build(binary: Path) -> str:
    """What `reusebench build` says it built (version, commit, flavor, flags), else the file's own hash."""
    info = builder.read_build_info(binary)
    if info:
        return builder.describe(info)
    try:
        return f"sha256 {file_sha256(binary)[:16]} of {binary}"
    except OSError as error:  # gone since the profile was loaded: the session says so when it starts it
        return f"{binary}: {error.strerror}"


def stamp(profile: profiles.Profile | None, variants: Iterable[str | profiles.Variant] | None = None,
          rules: Mapping[Path, Capabilities] | None = None, corpus: str | None = None, *,
          kind: RunKind = RunKind.SCENARIOS, launches: Mapping[str, Sequence[str]] | None = None,
          selection: Mapping[str, Any] | None = None) -> Stamp:
    """The stamp of running `variants` (names of `profile`'s, or variants themselves, such as whatif's
    combinations; default: all) of `profile` (None: the tap's, which launches nothing) from this checkout now, with
    each binary's capabilities where `rules` has them, the corpus its documents come from, the run's kind, each
    variant's resolved launch and what the command selected."""
    chosen = [] if profile is None else [profile.variant(v) if isinstance(v, str) else v for v in variants] \
        if variants is not None else list(profile.variants)
    builds: dict[Path, str] = {}  # one hash per binary, however many variants share it
    for variant in chosen:
        if variant.binary.path not in builds:
            builds[variant.binary.path] = binary_build(variant.binary.path)
    commit, dirty = reusebench_commit()
    rules = rules or {}
    return Stamp(commit, dirty, "" if profile is None else str(profile.path.resolve()),
                 "" if profile is None else profile_sha256(profile),
                 {variant.name: builds[variant.binary.path] for variant in chosen},
                 {variant.name: rules[variant.binary.path].to_dict() for variant in chosen
                  if variant.binary.path in rules},
                 {variant.name: dict(variant.options) for variant in chosen}, corpus, kind.value,
                 {name: list(args) for name, args in (launches or {}).items()}, dict(selection or {}))


def of_launches(profile: profiles.Profile, specs: Sequence[LaunchSpec], kind: RunKind,
                selection: Mapping[str, Any]) -> Stamp:
    """The stamp of a run of `profile`'s launches (a workload's, a replay's, whatif's): their variants, the rules
    each binary's probes showed and the resolved launch lines."""
    return stamp(profile, [s.variant for s in specs], {s.variant.binary.path: s.capabilities for s in specs},
                 kind=kind, launches={s.variant.name: s.args for s in specs}, selection=selection)


def write(run_dir: Path, run_stamp: Stamp) -> None:
    (run_dir / STAMP_FILE).write_text(json.dumps(run_stamp.to_dict(), indent=2) + "\n")


def read(run_dir: Path) -> Stamp | None:
    """The stamp a run left, or None for a run from before stamps."""
    path = run_dir / STAMP_FILE
    return Stamp(**json.loads(path.read_text())) if path.is_file() else None



def differences(recorded: Stamp, now: Stamp) -> list[str]:
    """What differs between a run's stamp and `now` (same profile file), one phrase each; [] when nothing does."""
    found = []
    if recorded.reusebench_commit != now.reusebench_commit:
        found.append(f"reusebench commit {recorded.reusebench_commit} (now {now.reusebench_commit})")
    if recorded.profile_sha256 != now.profile_sha256:
        found.append(f"profile {recorded.profile} as it was then (its content has changed since)")
    for variant, built in recorded.binaries.items():
        current = now.binaries.get(variant)
        if current != built:
            found.append(f"llama-server {built} for {variant} (now {current})")
    return found
