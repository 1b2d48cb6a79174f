"""Make the bundle the device check (tools/gpu_box_check.sh) carries to a GPU machine without network.

    python tools/gpu_box_bundle.py --binary PATH [--out .gpu-check] [--python-version 3.12]

`make gpu-check-bundle` runs it on the pinned llama.cpp's CUDA build. The bundle holds the binary, stripped and
xz-compressed (the CUDA build for sm_90 is 79 MiB, 70 stripped, 40 compressed; the device machine takes 64 MiB
along in all), with its build.json, and the wheels of reusebench's run-time dependencies for the GPU machine's
Python (asv, cmake and ninja stay behind: the check neither publishes nor builds). It prints the bundle's size
against what the device machine takes along.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEFT_BEHIND = ("asv", "cmake", "ninja")
CARRY_LIMIT_MIB = 64
MARKER = "BUNDLE"  # what lets the next run replace the directory


def requirements() -> list[str]:
    """pyproject's pinned dependencies that a run needs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [d for d in project["dependencies"] if d.split("==")[0] not in LEFT_BEHIND]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, required=True, help="the CUDA llama-server (reusebench build --flavor cuda)")
    parser.add_argument("--out", type=Path, default=REPO / ".gpu-check")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    args = parser.parse_args(argv)
    build_info = args.binary.parent / "build.json"
    if not args.binary.is_file() or not build_info.is_file():
        print(f"gpu_box_bundle: {args.binary} is not a llama-server that reusebench built", file=sys.stderr)
        return 1
    if args.out.exists() and any(args.out.iterdir()) and not (args.out / MARKER).is_file():
        print(f"gpu_box_bundle: {args.out} is not empty and not a bundle: give another --out", file=sys.stderr)
        return 1
    shutil.rmtree(args.out, ignore_errors=True)
    (args.out / "wheels").mkdir(parents=True)
    (args.out / MARKER).write_text("made by tools/gpu_box_bundle.py; replaced by its next run\n")
    stripped = args.out / "llama-server"
    shutil.copy2(args.binary, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    with open(stripped, "rb") as raw, lzma.open(args.out / "llama-server.xz", "wb", preset=6) as packed:
        shutil.copyfileobj(raw, packed)
    stripped.unlink()
    shutil.copy2(build_info, args.out / "build.json")
    pins = requirements()
    (args.out / "requirements.txt").write_text("".join(f"{pin}\n" for pin in pins))
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                    "--python-version", args.python_version, "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux2014_x86_64", "-d", str(args.out / "wheels"), *pins], check=True)
    files = [p for p in args.out.rglob("*") if p.is_file()]
    mib = sum(p.stat().st_size for p in files) / 2**20
    binary_mib = (args.out / "llama-server.xz").stat().st_size / 2**20
    print(f"{args.out}: {mib:.1f} MiB ({binary_mib:.1f} MiB llama-server.xz, {len(files) - 4} wheels), "
          f"{'within' if mib <= CARRY_LIMIT_MIB else 'OVER'} the device's {CARRY_LIMIT_MIB} MiB")
    return 0 if mib <= CARRY_LIMIT_MIB else 1


if __name__ == "__main__":
    raise SystemExit(main())
