"""One night: lock, pull, choose the commits, print the plan and its cost, asv run, asv publish, the nights' log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from reusebench.bisect import report
from reusebench.config import asv_selection, profiles
from reusebench.llama import binaries
from reusebench.nightly import bisection, commits, config, lock
from reusebench.report import site
from reusebench.run import runner
from reusebench.run.selection import Selection

LOG_FILE = "nightly.jsonl"  # one line per night: commits, asv's status, seconds
HASH_FILE = "commits.txt"
ASV_FAILED_BENCHMARKS = 2  # asv run's status when a benchmark failed: the rest is measured and published


class AsvFailed(RuntimeError):
    """An asv step failed for another reason than a failed benchmark (a build, the config, asv itself)."""


@dataclass(frozen=True)
class NightOptions:
    config: Path
    results: Path
    machine: str
    repo: Path | None = None
    branches: tuple[str, ...] = ()
    max_commits: int = 3
    pull: bool = True
    dry_run: bool = False
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment, for asv
    bench: str | None = None  # only the benchmarks this regular expression matches (asv run --bench)
    bisect: bool = True  # where a count changed since the last night, find the first commit that changed it
    # exactly these commits, oldest first (the history's: each build it chose that has no whole result), instead
    # of those after the newest measured
    commits: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Night:
    """What a night did: the commits it measured, asv run's status (None: nothing to run), the site."""

    commits: tuple[str, ...]
    asv_status: int | None
    html: Path
    seconds: float
    first_changes: tuple[dict[str, Any], ...] = ()  # per count changed since the last night: its first commit


def run_night(options: NightOptions, out: TextIO = sys.stderr) -> Night:
    """The night, under the results directory's lock; raises NightlyBusy when another holds it."""
    started = time.monotonic()
    cfg = config.derive(options.config, options.results, options.repo, options.branches)
    with lock.held(cfg.results):
        if options.pull:
            _pull(cfg.repo, out)
        done = commits.measured(cfg.asv_results, options.machine)
        chosen = list(options.commits) if options.commits is not None else \
            commits.to_measure(cfg.repo, cfg.branches, done, options.max_commits)
        # the sessions' raw records go under the results directory too, unless the environment says where
        env = {"REUSEBENCH_RESULTS": str(cfg.results / "records"), **os.environ, **options.env}
        print(estimate(chosen, cfg, env), flush=True)
        if options.dry_run:
            return Night(tuple(chosen), None, cfg.html, time.monotonic() - started)
        status = None
        if chosen:
            (cfg.results / HASH_FILE).write_text("".join(f"{c}\n" for c in chosen))
            asv(cfg.path, env, out, "machine", "--yes", "--machine", options.machine)
            status = asv(cfg.path, env, out, "run", f"HASHFILE:{cfg.results / HASH_FILE}", "--machine", options.machine,
                          "--skip-existing-successful", "--show-stderr",  # a failed benchmark named again runs again
                          *(("--bench", options.bench) if options.bench else ()), log=_log_path(cfg))
        found = bisection.first_changes(cfg.repo, cfg.branches, chosen, done, cfg.asv_results, options.machine, env,
                                        cfg.results, out) if chosen and options.bisect else []
        if found:
            print(report.render(found, "last night", "tonight"), file=out, flush=True)
        publish(cfg.path, env, out)
        night = Night(tuple(chosen), status, cfg.html, time.monotonic() - started, tuple(found))
        with open(cfg.results / LOG_FILE, "a") as log:
            log.write(json.dumps({"ended": datetime.now(UTC).isoformat(timespec="seconds"),
                                  "commits": list(chosen), "asv_run_status": status,
                                  "seconds": round(night.seconds, 1), "first_changes": found}) + "\n")
        bisection.write_page(cfg.html, _nights(cfg.results / LOG_FILE))
        return night


def estimate(chosen: Sequence[str], cfg: config.NightlyConfig, env: dict[str, str]) -> str:
    """The plan, printed before anything is built: the commits, the tokens each prefills, and the time the last
    night took per commit here."""
    lines = [f"nightly plan: {len(chosen)} commit(s) of {cfg.repo} ({', '.join(cfg.branches)}) not measured yet"]
    lines += [f"  {commit[:12]} {commits.git(cfg.repo, 'log', '-1', '--format=%cs %s', commit)[:80]}"
              for commit in chosen]
    if not chosen:
        return "\n".join([*lines, "nothing to build or run: publishing the site only"])
    try:
        selection = asv_selection.from_env({**env, asv_selection.BUILT_ENV: str(cfg.results / "env")})
        profile = profiles.load_profile(selection.profile, check_binary=False)
        plans = runner.plan_profile(profile, Selection(tuple(selection.variants), tuple(selection.sizes),
                                                       tuple(selection.scenarios),
                                                       early_stop=not selection.full_prefills))
        per_commit = sum(p.prefill for p in plans) * selection.repeat
        lines.append(f"each commit: a llama-server build (cached per commit and flags), then {selection.profile} at "
                     f"{' '.join(selection.size_labels)}: {len(plans) * selection.repeat} session(s) expected to "
                     f"prefill {per_commit:,} tokens, plus the option check and the service workloads")
        lines.append(f"in all: {per_commit * len(chosen):,} tokens prefilled over {len(chosen)} commit(s)")
    except (asv_selection.SelectionError, profiles.ProfileError, binaries.BinaryError) as exc:
        lines.append(f"tokens per commit unknown: {exc}")
    per_commit_s = _last_seconds_per_commit(cfg.results / LOG_FILE)
    lines.append(f"time: about {per_commit_s * len(chosen) / 60:.0f} min, at the last night's {per_commit_s:.0f} s per "
                 "commit here" if per_commit_s else "time: no earlier night here to time it by")
    return "\n".join(lines)


def _nights(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []


def _last_seconds_per_commit(log: Path) -> float | None:
    nights = _nights(log)
    measuring = [n for n in nights if n.get("commits")]
    return measuring[-1]["seconds"] / len(measuring[-1]["commits"]) if measuring else None


def _pull(repo: Path, out: TextIO) -> None:
    """Fast-forward the checked-out branch from its remote; a clone without one (or a failed pull) is read as is."""
    if not commits.git(repo, "remote"):
        print(f"{repo}: no remote, measuring it as it is", file=out)
        return
    done = subprocess.run(["git", "-C", str(repo), "pull", "--ff-only", "--quiet"], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{repo}: git pull --ff-only failed, measuring it as it is: {done.stderr.strip()[-300:]}", file=out)


def _log_path(cfg: config.NightlyConfig) -> Path:
    logs = cfg.results / "logs"
    logs.mkdir(exist_ok=True)
    return logs / f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-asv-run.log"


def publish(config_path: Path, env: dict[str, str], out: TextIO) -> Path:
    """asv publish, then the site's libraries put in it (it opens without internet); the site's directory."""
    asv(config_path, env, out, "publish")
    html = config.html_dir(config_path)
    site.make_self_contained(html)
    return html


def asv(config_path: Path, env: dict[str, str], out: TextIO, *args: str, log: Path | None = None) -> int:
    """One asv command on `config_path`, from the reusebench checkout (asv imports the plugin from there); its output to `out` as it comes, and into `log`. A failure other than a failed benchmark raises
    AsvFailed."""
    print(f"$ asv {' '.join(args)}", file=out, flush=True)
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(config.CHECKOUT), env.get("PYTHONPATH")]))}
    with open(log or os.devnull, "w") as kept:
        process = subprocess.Popen([sys.executable, "-m", "asv", *args, "--config", str(config_path)], cwd=config.CHECKOUT,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        tail: list[str] = []
        for line in process.stdout:
            kept.write(line)
            out.write(line)
            tail = [*tail[-40:], line]
        status = process.wait()
    if status not in (0, ASV_FAILED_BENCHMARKS) or (status and args[0] != "run"):
        raise AsvFailed(f"asv {' '.join(args)} failed with status {status}:\n{''.join(tail)}"
                                   + (f"(whole output: {log})" if log else ""))
    return status
