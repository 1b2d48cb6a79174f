"""The nightly's asv configuration: the shipped asv.llama.conf.json with its repository, branches and every path
it writes under one results directory."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asv import util as asv_util

from reusebench.nightly.commits import NightlyError, git

CONFIG_FILE = "asv.llama.conf.json"
# the reusebench checkout this runs from: asv.llama.conf.json, benchmarks/ and the asv plugin (tools/) are there,
# and asv runs there
CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class NightlyConfig:
    """Where one series of nights keeps everything: DIR/asv (results), DIR/html (site), DIR/env, DIR/records,
    DIR/logs, the lock and the nights' log."""

    path: Path  # the derived asv config, DIR/asv.llama.conf.json
    repo: Path
    branches: tuple[str, ...]
    results: Path

    @property
    def asv_results(self) -> Path:
        return self.results / "asv"

    @property
    def html(self) -> Path:
        return self.results / "html"


def html_dir(config: Path) -> Path:
    """Where `config` (an asv config) publishes its site."""
    try:
        conf = asv_util.load_json(str(config), js_comments=True)
    except (OSError, asv_util.UserError, ValueError) as exc:
        raise NightlyError(f"{config}: cannot read the asv config: {exc}") from None
    return config.resolve().parent / conf.get("html_dir", "html")


def derive(config: Path, results: Path, repo: Path | None = None, branches: Sequence[str] = ()) -> NightlyConfig:
    """Read `config`, point it at `repo` (default: its own `repo`, relative to it) and `branches` (default: its
    own), and write it as DIR/asv.llama.conf.json with every path it writes under `results`."""
    try:
        conf = asv_util.load_json(str(config), js_comments=True)
    except (OSError, asv_util.UserError, ValueError) as exc:
        raise NightlyError(f"{config}: cannot read the asv config: {exc}") from None
    source_dir = config.resolve().parent
    repo = (repo or source_dir / conf.get("repo", "")).resolve()
    if not (repo / ".git").exists():
        raise NightlyError(f"{config}: repo: {repo} is not a git checkout of llama.cpp (clone one there, or pass "
                           "--repo)")
    branches = tuple(branches or conf.get("branches") or ("master",))
    for branch in branches:
        try:
            git(repo, "rev-parse", "--verify", "--quiet", f"{branch}^{{commit}}")
        except NightlyError:
            raise NightlyError(f"{config}: branches: {repo} has no branch {branch!r}") from None
    results = results.resolve()
    results.mkdir(parents=True, exist_ok=True)
    conf.update(repo=str(repo), branches=list(branches), benchmark_dir=str(source_dir / conf["benchmark_dir"]),
                env_dir=str(results / "env"), results_dir=str(results / "asv"), html_dir=str(results / "html"))
    path = results / CONFIG_FILE
    path.write_text(json.dumps(conf, indent=2) + "\n")
    return NightlyConfig(path, repo, branches, results)


def commit_of(name: str, results: Path) -> str:
    """A hash (8 characters or more) as given; another name (a branch, a tag) through the clone of the nightly
    whose results are in `results`."""
    if re.fullmatch(r"[0-9a-f]{8,40}", name):
        return name
    derived = results / CONFIG_FILE
    if not derived.is_file():
        raise ValueError(f"{name!r} is not a commit hash, and {derived} (written by `reusebench nightly`) is not "
                         "there to find its clone")
    repo = Path(json.loads(derived.read_text())["repo"])
    return git(repo, "rev-parse", "--verify", f"{name}^{{commit}}")
