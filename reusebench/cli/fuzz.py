"""`reusebench fuzz`: the reuse model held against the real server on generated traffic and launches."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from reusebench.capability import build as capability_build
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.fuzz.case import FAMILIES, Case
from reusebench.fuzz.differential import Outcome, play
from reusebench.llama import binaries
from reusebench.run.recording import new_run_id

if TYPE_CHECKING:
    from reusebench.fuzz.search import Found

SUMMARY_FILE = "fuzz.json"
DEFAULT_CASES = 100
CASES_DIR = "tests/data/fuzz"  # where a kept case becomes a test (tests/test_fuzz.py replays every file there)


def cmd_fuzz(args: argparse.Namespace) -> int:
    out = common.progress(args)
    server_build = capability_build.of(binaries.resolve_binary(args.binary, source="--binary"))
    if args.case:
        return _play_files(args.case, server_build)
    from reusebench.fuzz.search import search  # hypothesis: loaded only by the command that draws cases

    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    families = args.family or list(FAMILIES)
    if args.model is not None and len(families) != 1:
        raise ValueError("--model takes one --family: the memory family of that model (its counts only)")
    run_dir = Path(args.results) / "fuzz" / new_run_id()
    run_dir.mkdir(parents=True)
    on = f" on {args.model.name} (counts only)" if args.model else ""
    print(f"fuzz: {args.cases} cases per family, {', '.join(families)}{on}; seed {seed}; {server_build.path}",
          file=out, flush=True)
    found: list[Found] = []
    started = time.monotonic()
    try:
        for family in families:
            result = search(family, server_build, cases=args.cases, seed_value=seed, shrink=not args.no_shrink,
                            outputs=not args.no_outputs and args.model is None, model_file=args.model,
                            say=lambda m: print(m, file=out, flush=True))
            found.append(result)
            _keep(run_dir, seed, args.model, found, time.monotonic() - started)
            print(_line(result), flush=True)
            if result.shrunk is not None:
                path = run_dir / f"{family}.json"
                path.write_text(json.dumps(result.shrunk.case.to_json(), indent=2) + "\n")
                print(f"{_shrunk(result.shrunk)}\n  kept: {path} (copy it to {CASES_DIR}/ to make it a test)",
                      flush=True)
            if result.interrupted:
                raise KeyboardInterrupt  # its cases kept above; the stop is the one of Ctrl-C anywhere else
    except KeyboardInterrupt:
        summary = _keep(run_dir, seed, args.model, found, time.monotonic() - started, interrupted=True)
        return common.interrupted(lambda: f"interrupted after {sum(r.cases for r in found)} cases; every server "
                                  f"stopped; kept: {summary}")
    summary = _keep(run_dir, seed, args.model, found, time.monotonic() - started)
    print(f"\nsummary: {summary}", file=out)
    return Exit.FINDING if any(r.shrunk for r in found) else Exit.OK


def _play_files(paths: list[Path], server_build: capability_build.Build) -> int:
    differed = False
    for path in paths:
        outcome = play(Case.read(path), server_build, outputs=True)
        differed |= outcome.difference is not None
        print(f"{path}: " + ("differs" if outcome.difference else f"{len(outcome.steps)} requests as expected"))
        print(_shrunk(outcome) if outcome.difference else "")
    return Exit.FINDING if differed else Exit.OK


def _line(result: Found) -> str:
    verdict = "a difference, shrunk below" if result.shrunk else "no difference" + (
        " (interrupted)" if result.interrupted else "")
    paths = ", ".join(f"{name} {count}" for name, count in result.paths.most_common())
    compared = ", ".join(f"{verdict} {count}" for verdict, count in result.outputs.most_common())
    named = (f"\n  reused outputs against no reuse: {compared}" if compared else "") + "".join(f"\n  cases that ended at a known server defect ({name}): {count}"
                    for name, count in result.defects.items())
    return (f"{result.family}: {result.generated} generated cases, {result.requests} requests, "
            f"{result.seconds:.0f} s: {verdict}" + (f"\n  requests through: {paths}" if paths else "") + named)


def _shrunk(outcome: Outcome) -> str:
    difference = outcome.difference
    assert difference is not None
    return f"{outcome.case.describe()}\n  {difference.describe()}"


def _keep(run_dir: Path, seed: int, model: Path | None, found: list[Found], seconds: float, *,
          interrupted: bool = False) -> Path:
    path = run_dir / SUMMARY_FILE
    path.write_text(json.dumps({
        "seed": seed, "model": model.name if model else None, "seconds": round(seconds), "interrupted": interrupted,
        "families": [{"family": r.family, "generated": r.generated, "cases": r.cases, "requests": r.requests,
                      "seconds": round(r.seconds), "interrupted": r.interrupted, "paths": dict(r.paths), "outputs": dict(r.outputs),
                      "defects": dict(r.defects), "difference": r.shrunk.difference.describe()
                      if r.shrunk and r.shrunk.difference else None} for r in found]}, indent=2) + "\n")
    return path


def _gguf(text: str) -> Path:
    """An argparse type: `real:NAME` (installed by `reusebench models --real`) or a GGUF file that is there."""
    from reusebench import real
    from reusebench.llama.gguf_check import check_gguf

    try:
        if real.is_real_spec(text):
            return real.model_path(text.removeprefix(real.SPEC_PREFIX))
        path = Path(text).expanduser()
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"no model file {text!r}")
        check_gguf(path)
    except ValueError as error:  # an unknown or missing real model, a file that is no GGUF
        raise argparse.ArgumentTypeError(str(error)) from None
    return path


def add_fuzz(sub: common.Subparsers) -> None:
    parser = common.add_command(
        sub, "fuzz", "hold the reuse model against the real server on generated traffic and launches; exit 1 if "
        "they differ",
        "For a tiny model of each memory family (attention, a window, a chunked window, recurrent, a hybrid that "
        "can and one that cannot shift, a windowed hybrid), generate launches (slots, RAM cache down to 1 MiB, "
        "checkpoints, their spacing, similarity, cache-reuse, batch sizes, --swa-full) and serial traffic (new "
        "documents, resends, growing chats, edits, re-asks, slot saves, restores and erases), play each case on a "
        "real llama-server and on the reuse model, and hold every request's measured count and slot against the "
        "expected ones, and every reused output against the same prompt computed without reuse on a second server "
        "(beyond the noise, and not foreseen by the model, it is a wrong output: a finding about llama.cpp). The "
        "first case that differs is shrunk to the smallest that still differs and kept as a "
        "case file (RESULTS/fuzz/ID/FAMILY.json); copied into tests/data/fuzz/ it is a test. Exit 1 when a "
        "difference was found.")
    parser.add_argument("--family", action="append", choices=list(FAMILIES), metavar="FAMILY",
                        help=f"a memory family (repeatable; default all: {', '.join(FAMILIES)})")
    parser.add_argument("--cases", type=common.positive_int, default=DEFAULT_CASES,
                        help=f"generated cases per family (default {DEFAULT_CASES})")
    parser.add_argument("--seed", type=int, help="the generator's seed, to repeat a run (default: a new one, "
                        "printed)")
    parser.add_argument("--no-shrink", action="store_true", help="keep the first differing case as generated")
    parser.add_argument("--no-outputs", action="store_true", help="counts only: do not compute each reused request "
                        "again without reuse on a second server to compare the outputs")
    parser.add_argument("--case", action="append", type=Path, metavar="FILE",
                        help="play this case file instead of generating (repeatable)")
    parser.add_argument("--model", type=_gguf, metavar="FILE",
                        help="a GGUF of the one --family's memory in place of its tiny model: a file or real:NAME "
                        "(real:gemma3-270m for window); counts only: the outputs' noise floor is a tiny model's")
    parser.add_argument("--binary", default="default", help="the llama-server (default: the pinned build)")
    parser.add_argument("--results", default="results", help="results directory (default: results)")
    parser.set_defaults(func=cmd_fuzz)
