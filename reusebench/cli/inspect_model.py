"""`reusebench inspect MODEL.gguf`: what the suite believes about a model, without a run."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from reusebench.advise import inspection
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.config import profiles, sizes
from reusebench.llama import binaries
from reusebench.run.progress import fit

BASE_PROFILE = "tiny-base"  # report A's launch options: one slot, ubatch 512, 32 checkpoints, an 8 GiB RAM cache
DEFAULT_SIZE = "32K"


def cmd_inspect(args: argparse.Namespace) -> int:
    model: Path = args.model
    if not model.is_file():
        raise ValueError(f"{model} does not exist")
    profile = profiles.load_profile(args.profile or BASE_PROFILE)
    variant = profile.variant(args.variant) if args.variant else profile.variants[0]
    binary = binaries.resolve_binary(args.binary, source="--binary") if args.binary else variant.binary
    variant = dataclasses.replace(variant, model=model.resolve(), model_spec=str(model), binary=binary, mmproj=None,
                                  lora=())
    # your profile's corpus; with the embedded launch, what a profile of MODEL alone reads (real prose)
    corpus = profile.corpus if args.profile else profiles.REAL_PROSE_CORPUS
    profile = dataclasses.replace(profile, variants=(variant,), corpus=corpus)
    found = inspection.inspect(profile, args.size or [sizes.parse_size(DEFAULT_SIZE)])
    print(json.dumps(found.to_dict(), indent=2) if args.json else
          fit(inspection.render(found), common.TERMINAL_COLUMNS))
    return Exit.OK


def add_inspect(sub: common.Subparsers) -> None:
    shows = "what the suite believes about a model: its memory as llama-server builds it, and what each step costs"
    parser = common.add_command(sub, "inspect", shows, (
        "What the suite believes about MODEL, without a run: the architecture, its memory as the llama-server that "
        "loads it reports at startup (attention, recurrent, hybrid, a window and its type), whether --cache-reuse "
        "can work, what --swa-full changes, whether the reuse model follows this memory, and the tokens each "
        "step of a run would re-process, predicted at each --size: the plan `run` makes for the profile's launch "
        f"(the embedded default's, {BASE_PROFILE}, unless --profile names yours), with MODEL in it. The memory is "
        "read from one short start of the server, kept per binary and model file."))
    parser.add_argument("model", type=Path, metavar="MODEL.gguf", help="the model file")
    parser.add_argument("--binary", metavar="PATH", help="the llama-server that loads it (default: the profile's, "
                        "`default`: the pinned build)")
    common.add_profile(parser, required=False, what=f"launch options from this profile (default: {BASE_PROFILE})")
    parser.add_argument("--variant", metavar="NAME", help="the profile's variant (default: its first)")
    parser.add_argument("--size", action="append", type=common.token_size, metavar="SIZE", help="prompt size to predict, e.g. 32K "
                        "(repeatable; default: 32K)")
    common.add_json(parser, "the memory, the verdicts and the predicted costs as JSON")
    parser.set_defaults(func=cmd_inspect)
