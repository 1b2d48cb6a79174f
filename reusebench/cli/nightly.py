"""`reusebench nightly` (asv over new llama.cpp commits), `compare` (two commits, the suite's noise rule) and `site`
(publish and serve the asv site)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from reusebench import nightly
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.report import asv_results, site_server

NIGHTLY_RESULTS = Path("results") / "llama"


def cmd_nightly(args: argparse.Namespace) -> int:
    options = nightly.NightOptions(config=args.config, results=args.results, machine=args.machine, repo=args.repo,
                                   branches=tuple(args.branch or ()), max_commits=args.max_commits,
                                   pull=not args.no_pull, dry_run=args.dry_run, bisect=not args.no_bisect)
    out = common.progress(args)
    try:
        night = nightly.run_night(options, out)
    except nightly.NightlyBusy as exc:
        print(f"reusebench nightly: {exc}", file=sys.stderr)
        return Exit.BUSY
    except nightly.AsvFailed as exc:
        print(f"reusebench nightly: {exc}", file=sys.stderr)
        return Exit.FINDING
    except KeyboardInterrupt:
        return common.interrupted(lambda: f"interrupted: asv stopped; what it measured is under {args.results}/asv")
    if args.dry_run:
        return Exit.OK
    print(f"nightly: {len(night.commits)} commit(s) measured in {night.seconds:.0f} s, {len(night.first_changes)} "
          f"count(s) changed since the last night; site: {night.html / 'index.html'} "
          f"(`reusebench site --results {args.results} --serve`)", file=out)
    return Exit.FINDING if night.asv_status else Exit.OK


def add_nightly(sub: common.Subparsers) -> None:
    parser = common.add_command(
        sub, "nightly", "asv over the llama.cpp commits not measured yet; the site published",
        "The nightly for a GPU box (docs/nightly.md; a systemd timer ships in tools/systemd/). Under a lock on the "
        "results directory: pulls the llama.cpp clone, picks per branch the commits after the newest one measured "
        "(none measured: the newest; at most --max-commits), prints the plan and its cost, then asv builds each with "
        "`reusebench build` and runs benchmarks/ on it; where a count changed since the last night, bisects the "
        "commits between to the first that changed it; and publishes the site. Everything goes under --results: "
        "asv/ (results), html/ (site), env/, records/, bisect/, logs/, nightly.jsonl (one line per night). What runs is the "
        "REUSEBENCH_ASV_* selection (docs/environment.md).")
    parser.add_argument("--config", type=Path, default=nightly.CHECKOUT / nightly.CONFIG_FILE,
                        help=f"the asv config to derive from (default: {nightly.CONFIG_FILE} in the reusebench checkout)")
    parser.add_argument("--repo", type=Path, help="the llama.cpp clone (default: the config's `repo`)")
    parser.add_argument("--branch", action="append", help="a branch to follow (repeatable; default: the config's)")
    parser.add_argument("--results", type=Path, default=NIGHTLY_RESULTS,
                        help=f"the one directory everything goes under (default: {NIGHTLY_RESULTS})")
    parser.add_argument("--max-commits", type=_positive, default=3, metavar="N",
                        help="at most N new commits per branch a night, the newest (default 3)")
    parser.add_argument("--machine", default=platform.node(), help="asv's machine name (default: this host's name)")
    parser.add_argument("--no-pull", action="store_true", help="measure the clone as it is")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its cost, then stop")
    parser.add_argument("--no-bisect", action="store_true", help="where a count changed since the last night, do "
                        "not bisect the commits between (by default the first one that changed it is named)")
    parser.set_defaults(func=cmd_nightly)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number, 1 or more, got {text!r}")
    return int(text)


def cmd_compare(args: argparse.Namespace) -> int:
    results = args.results / "asv"
    before, after = (nightly.commit_of(commit, args.results) for commit in (args.before, args.after))
    figures = [asv_results.stored(results, commit, args.machine) for commit in (before, after)]
    for commit, found in zip((args.before, args.after), figures):
        if not found:
            raise ValueError(f"no asv results for {commit} under {results}"
                             + (f" on machine {args.machine}" if args.machine else ""))
    changes = asv_results.compare(*figures)
    if args.json:
        print(json.dumps([{"kind": c.kind, "benchmark": c.key[0], "params": [p.strip("'") for p in c.key[1]],
                           "before": c.before, "after": c.after} for c in changes], indent=2))
    else:
        print(asv_results.render(changes, before, after))
    return Exit.FINDING if any(c.kind == "regression" for c in changes) else Exit.OK


def add_compare(sub: common.Subparsers) -> None:
    parser = common.add_command(
        sub, "compare", "two commits' asv figures under the suite's noise rule; exit 1 on a regression",
        "Two commits' asv figures side by side, each change judged by the suite's noise rule: a count (re-processed "
        "tokens, mismatches, missed turns, verdict codes) changes exactly or not at all, so any change counts; a "
        "time and the harness's own budget count beyond 10% (asv compare's default factor) and, where the runs "
        "repeated first loads, only when their ranges part by that factor; a time either run took while other work "
        "loaded the machine is not judged, only counted under the table; the GPU, load and spread figures explain "
        "the others and never count. Lower is better, as in asv. Exits 1 when a figure regressed.")
    parser.add_argument("before", help="a commit hash (8 characters or more), or a branch or tag of the nightly's clone")
    parser.add_argument("after")
    parser.add_argument("--results", type=Path, default=NIGHTLY_RESULTS,
                        help=f"the nightly's results directory (default: {NIGHTLY_RESULTS})")
    parser.add_argument("--machine", help="only this asv machine's results (default: any)")
    common.add_json(parser, "the changes as JSON on stdout")
    parser.set_defaults(func=cmd_compare)


def cmd_site(args: argparse.Namespace) -> int:
    config = args.config or args.results / nightly.CONFIG_FILE
    if not config.is_file():
        raise ValueError(f"no asv config at {config}: run `reusebench nightly` first, or pass --config asv.conf.json "
                         "(make bench's site)")
    out = common.progress(args)
    html = nightly.publish(config, dict(os.environ), out)
    if not args.serve:
        print(html / "index.html")
        return Exit.OK
    warning = site_server.exposure_warning(args.listen[0])
    if warning:
        print(warning, file=sys.stderr)
    server = site_server.SiteServer(html, args.listen)
    print(f"serving {html} on {server.url} (Ctrl-C stops)", file=out, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return Exit.OK


def add_site(sub: common.Subparsers) -> None:
    parser = common.add_command(
        sub, "site", "publish the asv site (self-contained) and, with --serve, serve it on loopback",
        "Publish the asv site with its libraries inside (it opens without internet) and print its index.html; with "
        "--serve, serve it read-only (GET and HEAD, a read timeout, a connection cap) on 127.0.0.1 unless --listen "
        "names another address.")
    parser.add_argument("--results", type=Path, default=NIGHTLY_RESULTS,
                        help=f"the nightly's results directory (default: {NIGHTLY_RESULTS})")
    parser.add_argument("--config", type=Path, help="another asv config instead: asv.conf.json is make bench's site")
    parser.add_argument("--serve", action="store_true", help="serve the site until Ctrl-C")
    parser.add_argument("--listen", type=common.address, default=site_server.DEFAULT_LISTEN, metavar="HOST:PORT",
                        help="with --serve (default 127.0.0.1:8080)")
    parser.set_defaults(func=cmd_site)
