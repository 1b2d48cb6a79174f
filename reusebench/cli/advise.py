"""`reusebench advise` (profile changes for prompt reuse) and `reusebench agreement` (the reuse model's record)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from reusebench import records
from reusebench.advise import advice, agreement
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import profiles, sizes


def cmd_agreement(args: argparse.Namespace) -> int:
    not_run: list[agreement.NotRun] = []
    if args.records:
        recorded = records.read_many(common.records_paths(args.records))
    else:
        started = time.monotonic()
        out = common.progress(args)
        recorded, not_run = agreement.run(
            args.profile or agreement.TINY_PROFILES, agreement.option_sets_named(args.option_set),
            args.size or agreement.DEFAULT_SIZES, results_dir=Path(args.results), verify=not args.no_verify, out=out)
        print(f"agreement runs took {time.monotonic() - started:.0f} s", file=out)
    print(agreement.render(recorded, not_run))
    return Exit.OK


def add_agreement(sub: common.Subparsers) -> None:
    agree = common.add_command(sub, "agreement", "does the reuse model predict the real server?", "Does the reuse "
                               "model predict the real server? Runs every scenario on each profile under each option "
                               "set and size, and prints the agreements per profile, option set and size, and every "
                               "disagreement with both causes.")
    common.add_profile(agree, required=False, what="profile name or path (repeatable; default: the tiny profiles)")
    agree.set_defaults(profile=None)
    agree.add_argument("--option-set", action="append", metavar="NAME",
                       help=f"repeatable; default: all of {', '.join(agreement.OPTION_SETS)}")
    agree.add_argument("--size", action="append", type=common.token_size, help="repeatable; default: "
                       f"{' and '.join(sizes.size_label(s) for s in agreement.DEFAULT_SIZES)}")
    agree.add_argument("--results", default=str(common.RESULTS_DIR), help="where the runs go (default: results)")
    agree.add_argument("--no-verify", action="store_true", help="skip the no-reuse references (faster; wrong outputs "
                       "are then not counted)")
    agree.add_argument("--records", nargs="+", metavar="RUN", help="tabulate these recorded runs instead of running")
    agree.set_defaults(func=cmd_agreement)


def cmd_advise(args: argparse.Namespace) -> int:
    profile = profiles.load_profile(args.profile)
    if args.variant:
        profile = dataclasses.replace(profile, variants=tuple(profile.variant(name) for name in args.variant))
    started = time.monotonic()
    out = common.progress(args)
    found = advice.advise(profile, results_dir=Path(args.results), say=lambda line: print(line, file=out))
    print(advice.render(found))
    print(f"\nadvice for {profile.name} took {time.monotonic() - started:.0f} s", file=out)
    return Exit.OK


def add_advise(sub: common.Subparsers) -> None:
    adv = common.add_command(sub, "advise", "profile changes for prompt reuse, each with its effect", "Profile "
                             "changes for prompt reuse, each with its effect: measured by a short run on the "
                             "profile's model where tried, predicted by the reuse model where not.")
    common.add_profile(adv)
    adv.add_argument("--variant", action="append", metavar="NAME", help="only this matrix variant (repeatable)")
    adv.add_argument("--results", default=str(common.RESULTS_DIR), help="where the trial runs go (default: results)")
    adv.set_defaults(func=cmd_advise)
