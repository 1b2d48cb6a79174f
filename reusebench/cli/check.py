"""`reusebench check` (is each option of a profile really active?) and `reusebench probe` (what a build does)."""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from pathlib import Path

from reusebench import capability, check
from reusebench.capability import build as build_mod
from reusebench.capability import cache as capability_cache
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import profiles
from reusebench.llama import binaries
from reusebench.records import RunKind
from reusebench.report import run_kinds, view
from reusebench.run import provenance
from reusebench.run.opening import stamped_run


def cmd_check(args: argparse.Namespace) -> int:
    # --help is compared per option inside the check, so every unknown option gets its own UNSUPPORTED row
    profile = profiles.load_profile(args.profile, check_binary=False)
    variants = [profile.variant(name) for name in args.variant] if args.variant else list(profile.variants)
    failing_verdicts = check.STRICT_FAILING_VERDICTS if args.strict else check.FAILING_VERDICTS
    found: list[dict[str, object]] = []
    texts, failing = [], False
    out = common.progress(args)
    width = None if args.wide else common.TERMINAL_COLUMNS
    interrupted = False
    for variant in variants:
        print(f"checking {variant.profile} / {variant.name} ...", file=out)
        say = lambda message: print(f"  {message}", file=out, flush=True)  # noqa: E731
        server_build: build_mod.Build | None = None
        try:
            try:  # probing a new build's rules takes a while: Ctrl-C there too keeps what was reached
                server_build = build_mod.of(variant.binary, say)
            except binaries.BinaryError:  # the verdicts say why it did not run
                server_build = None
            verdicts = check.check_variant(variant, progress=say, build=server_build, only=args.option or ())
        except (check.CheckInterrupted, KeyboardInterrupt) as stopped:
            interrupted = True
            reached = stopped.verdicts if isinstance(stopped, check.CheckInterrupted) else []
            found.append({**check.describe_launch(variant, server_build), "incomplete": check.INTERRUPTED,
                          "verdicts": [v.to_dict() for v in reached]})
            texts.append(check.render_report(variant, server_build, reached, width=width) + f"\nINCOMPLETE: {check.INTERRUPTED}")
            break
        failing |= any(v.verdict in failing_verdicts for v in verdicts)
        rules = server_build.capabilities if server_build else capability_cache.of_binary(variant.binary)
        found.append({**check.describe_launch(variant, server_build), "capabilities": rules.to_dict(),
                      "verdicts": [v.to_dict() for v in verdicts]})
        uses = capability.features(mmproj=variant.mmproj is not None, lora=bool(variant.lora),
                                   sleeps=bool(variant.number("sleep-idle-seconds", 0)))
        rule_lines = rules.lines(uses) if width is None else [
            textwrap.fill(line, width, subsequent_indent="  ") for line in rules.lines(uses)]
        texts.append(check.render_report(variant, server_build, verdicts, width=width) + "\n\n" + "\n".join(rule_lines))
    print(json.dumps(found, indent=2) if args.json else "\n\n".join(texts))
    stamp = provenance.stamp(profile, variants, kind=RunKind.CHECK, selection={"options": list(args.option or ()),
                                                                               "strict": args.strict})
    page = view.write_check_page(stamped_run(Path(args.results), stamp).path, found)
    view.write_index(Path(args.results))
    if interrupted:  # what was reached is kept, and says it is incomplete
        not_started = [v.name for v in variants[len(found):]]
        return common.interrupted(lambda: f"interrupted: every server stopped; the verdicts reached are in "
                                  f"{page.parent / run_kinds.CHECK_FILE} and {page}, marked incomplete"
                                  + (f"; variants not checked: {', '.join(not_started)}" if not_started else ""))
    print(f"page: {page}", file=out)
    return Exit.FINDING if failing else Exit.OK


def add_check(sub: common.Subparsers) -> None:
    check_cmd = common.add_command(
        sub, "check", "is each option really active? a verdict with evidence per option",
        "Is each option of a profile really in effect? Starts the profile's llama-server per variant and probes each "
        "option it sets and each reuse default: ACTIVE, DISABLED (the server turned it off, its own line quoted), "
        "INEFFECTIVE (on, but the probe saw no effect), UNSAFE (on, and reused output was wrong), UNSUPPORTED (this "
        "build does not know the option) or UNVERIFIED (no probe could decide). Exits 1 when a verdict is UNSAFE or "
        "UNSUPPORTED, and with --strict also when one is DISABLED or INEFFECTIVE, so a script or a nightly can use "
        "the exit status.")
    common.add_profile(check_cmd)
    check_cmd.add_argument("--variant", action="append", metavar="NAME", help="only this matrix variant (repeatable; default: every "
                           "variant of the profile)")
    check_cmd.add_argument("--strict", action="store_true", help="exit 1 also when an option is DISABLED or "
                           "INEFFECTIVE (an option you set that does nothing)")
    check_cmd.add_argument("--option", action="append", metavar="NAME", help="check only this option (as the "
                           "profile writes it, or a reuse default such as cache-ram; repeatable)")
    common.add_wide(check_cmd)
    common.add_json(check_cmd, "every variant's launch, capabilities and verdicts as JSON on stdout instead of tables")
    check_cmd.add_argument("--results", default=str(common.RESULTS_DIR), help="where its run directory with the "
                           "verdicts (check.json) and their page goes (default: results)")
    check_cmd.set_defaults(func=cmd_check)


def cmd_probe(args: argparse.Namespace) -> int:
    binary = binaries.resolve_binary(args.binary, source="reusebench probe")
    started = time.monotonic()
    out = common.progress(args)
    found = capability_cache.of_binary(binary, lambda message: print(message, file=out), again=args.again)
    print(json.dumps(found.to_dict(), indent=2) if args.json else "\n".join(found.lines()))
    print(f"{binary.path}: {found.how} ({time.monotonic() - started:.1f} s); kept in {capability_cache.cache_dir()}",
          file=common.progress(args))
    return Exit.OK if not found.how.startswith("not probed") else Exit.FINDING


def add_probe(sub: common.Subparsers) -> None:
    probe = common.add_command(
        sub, "probe", "what a llama-server build does where builds differ", "What a llama-server build does where "
        "builds differ (slot files with checkpoints, restores, user-message checkpoints, LoRA in the RAM cache, "
        "sleep): short probes on a tiny model, cached by the executable's hash; the reuse model takes its rules from "
        "them.")
    probe.add_argument("binary", nargs="?", default=binaries.DEFAULT, help="default (the pinned build), default:cuda, "
                       "or a path (a launcher script is followed to the executable it starts)")
    probe.add_argument("--again", action="store_true", help="probe even when a result is cached, and replace it")
    common.add_json(probe, "JSON on stdout instead of lines")
    probe.set_defaults(func=cmd_probe)
