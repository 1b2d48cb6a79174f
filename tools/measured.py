"""docs/measured.md, the one table of how long the suite's commands took, from docs/measured.json.

    python tools/measured.py time ID --what "conditions" -- make bench   # run it, record its seconds, render
    python tools/measured.py render                                      # docs/measured.md from the JSON

Each entry is one timed run: its command, the conditions, the seconds, the date and the
machine. The pages quote the table's durations (tests/test_docs.py holds them to it), so
two pages cannot give two times for one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "measured.json"
PAGE = REPO / "docs" / "measured.md"

HEADER = """# Measured on

How long the suite's commands took, each a run we did: the one source the other pages quote. Regenerated from
`docs/measured.json` by `python tools/measured.py render`; `python tools/measured.py time ID --what ... -- COMMAND`
times a command and adds or replaces its row. Back to the [README](../README.md).

| command | conditions | took | on | machine |
|---|---|---|---|---|
"""


def duration(seconds: float) -> str:
    """As the pages write it: "6 min 24 s (384 s)", or "14 s" under a minute."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest} s ({whole:,} s)"


def render(entries: list[dict[str, object]]) -> str:
    rows = [f"| `{e['command']}` | {e['what']} | {duration(float(e['seconds']))} | {e['date']} | {e['machine']} |"
            for e in entries]
    return HEADER + "\n".join(rows) + "\n"


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
               platform.processor() or platform.machine())
    return f"{len(os.sched_getaffinity(0))}-core {cpu}, {'AVX-512' if 'avx512f' in info else 'AVX2'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("render", help="write docs/measured.md from docs/measured.json")
    timing = sub.add_parser("time", help="run a command, record how long it took, render")
    timing.add_argument("id", help="the row's id: a new one adds a row, an existing one replaces it")
    timing.add_argument("--what", required=True, help="the conditions, as the table says them")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)  # what follows "--" is the command, untouched
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    entries = json.loads(DATA.read_text())
    if args.action == "time":
        if not command:
            parser.error("time: no command after --")
        started = time.monotonic()
        status = subprocess.run(command).returncode
        if status != 0:
            print(f"measured: {shlex.join(command)} exited {status}; nothing recorded", file=sys.stderr)
            return status
        entry = {"id": args.id, "command": shlex.join(command), "what": args.what,
                 "seconds": round(time.monotonic() - started), "date": date.today().isoformat(), "machine": machine()}
        ids = [e["id"] for e in entries]
        if args.id in ids:
            entries[ids.index(args.id)] = entry
        else:
            entries.append(entry)
        DATA.write_text("[\n" + ",\n".join(f"  {json.dumps(e)}" for e in entries) + "\n]\n")
        print(f"measured: {entry['command']}: {duration(entry['seconds'])}", file=sys.stderr)
    PAGE.write_text(render(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
