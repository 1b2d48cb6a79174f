"""`reusebench tap` (record a running server's traffic) and `reusebench log-filter` (the log lines it reads)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from reusebench import listening
from reusebench.cli import common
from reusebench.cli.exits import Exit
from reusebench.llama import logs
from reusebench.tap import Tap, TapOptions, conversations
from reusebench.tap.keys import KeyFileError, default_key_path
from reusebench.tap.relay import RelayLimits
from reusebench.tap.tap import HeldLimits

EXPOSED = "reaches the upstream server through it"


def cmd_tap(args: argparse.Namespace) -> int:
    if not listening.is_loopback(args.listen[0]):
        if not args.expose:
            raise ValueError(f"--listen {args.listen[0]} is not loopback: the tap has no login of its own, so say "
                             "--expose to listen there")
        print(listening.exposure_warning(args.listen[0], EXPOSED), file=sys.stderr)
    if args.trace is not None and args.trace.exists():
        raise ValueError(f"--trace {args.trace}: the file exists; the tap does not write over a trace")
    if args.server_log is None:
        print("reusebench tap: no --server-log: records will carry counts and classes but no causes", file=sys.stderr)
    try:
        tap = Tap(tap_options(args))
    except KeyFileError as exc:
        print(f"reusebench tap: {exc}", file=sys.stderr)
        return Exit.CONFIG
    except OSError as exc:  # the port is taken, the results directory cannot be written
        print(f"reusebench tap: cannot start on {args.listen[0]}:{args.listen[1]}: {exc}", file=sys.stderr)
        return Exit.USAGE

    def terminated(signum: int, frame: object) -> None:  # the clean stop of Ctrl-C, and the records say it was SIGTERM
        tap.ending("SIGTERM")
        common.terminated(signum, frame)

    signal.signal(signal.SIGTERM, terminated)
    tap.run()  # until Ctrl-C or SIGTERM: what is in flight is recorded as interrupted, the summary last
    summary = tap.summary
    assert summary is not None
    print(common.write_run_report(tap.run_dir.path, f"tap, run {tap.run_dir.path.name}").text)
    print(f"\n{summary.extra['requests']} requests recorded; report: {tap.run_dir.path / 'report.md'}",
          file=common.progress(args))
    return Exit.OK


def tap_options(args: argparse.Namespace) -> TapOptions:
    return TapOptions(upstream=args.upstream, listen=args.listen, results=Path(args.results), key_file=args.key_file,
                      server_log=args.server_log, probe_tokens=args.probe_tokens, gap_s=args.gap_minutes * 60.0,
                      long_prefill_tokens=args.long_prefill_tokens,
                      limits=RelayLimits(max_body_bytes=args.max_body_mib * 2**20, read_timeout_s=args.read_timeout,
                                         max_connections=args.max_connections),
                      held=HeldLimits(conversation_tokens=args.max_held_tokens, ideal_tokens=args.max_ideal_tokens,
                                      tasks=args.max_tasks), trace=args.trace)


def add_tap(sub: common.Subparsers) -> None:
    shows = ("relay a running llama-server and record every completion request without its text: counts, class "
             "(first, continues, regenerate, head insert, ...), ideal and cause from the server's log, for the "
             "service report; stops on Ctrl-C or SIGTERM")
    tap = common.add_command(sub, "tap", shows.split(":")[0], shows)
    tap.add_argument("--upstream", required=True, help="the server, e.g. http://127.0.0.1:8080")
    tap.add_argument("--listen", type=common.address, default=("127.0.0.1", 8081), metavar="HOST:PORT",
                     help="where clients connect (default 127.0.0.1:8081; another address only with --expose)")
    tap.add_argument("--expose", action="store_true", help="allow a --listen address that is not loopback (the tap "
                     "has no login: anyone who reaches it reaches the server)")
    limits = RelayLimits()
    tap.add_argument("--max-body-mib", type=common.positive_int, default=limits.max_body_bytes // 2**20, metavar="MIB",
                     help=f"a request body beyond this is refused with 413 (default {limits.max_body_bytes // 2**20})")
    tap.add_argument("--read-timeout", type=common.positive_float, default=limits.read_timeout_s, metavar="SECONDS",
                     help="a client connection that sends nothing for this long is closed (default "
                     f"{limits.read_timeout_s:g})")
    tap.add_argument("--max-connections", type=common.positive_int, default=limits.max_connections, metavar="N",
                     help=f"client connections at once; beyond, 503 (default {limits.max_connections})")
    held = HeldLimits()
    tap.add_argument("--max-held-tokens", type=common.token_size, default=held.conversation_tokens, metavar="N",
                     help="ids of the live conversations' last prompts held at most, oldest conversation dropped "
                     f"first (default {held.conversation_tokens:,}: 4 bytes each)")
    tap.add_argument("--max-ideal-tokens", type=common.token_size, default=held.ideal_tokens, metavar="N",
                     help="ids of the sequences the perfect cache has seen, held at most, oldest dropped first "
                     f"(default {held.ideal_tokens:,})")
    tap.add_argument("--max-tasks", type=common.positive_int, default=held.tasks, metavar="N",
                     help=f"the server log's tasks held at most, oldest dropped first (default {held.tasks:,})")
    tap.add_argument("--server-log", type=Path, metavar="FILE", help="the server's -lv 4 log, best through "
                     "`reusebench log-filter`: the causes come from it")
    tap.add_argument("--trace", type=Path, metavar="FILE", help="also write the requests as a trace in Mooncake's "
                     "format (lengths, arrival times, salted 512-token prefix-block ids; no text) for `replay` and "
                     "`whatif`; a new file")
    tap.add_argument("--results", default=str(common.RESULTS_DIR), help="results directory (default: results)")
    tap.add_argument("--key-file", type=Path, default=default_key_path(), help="the secret for the records' keyed "
                     "hashes, made on first use (default ~/.config/reusebench/tap.key or $REUSEBENCH_TAP_KEY); "
                     "never inside the results")
    tap.add_argument("--probe-tokens", type=int, default=conversations.DEFAULT_PROBE_TOKENS, metavar="N",
                     help="a request of at most N tokens that continues no conversation is unrelated (a health "
                     f"check): recorded as a probe (default {conversations.DEFAULT_PROBE_TOKENS})")
    tap.add_argument("--gap-minutes", type=float, default=conversations.DEFAULT_GAP_S / 60, metavar="M",
                     help="a turn after M idle minutes of its conversation (and no sleep) is 'after a gap' "
                     f"(default {conversations.DEFAULT_GAP_S / 60:g})")
    tap.add_argument("--long-prefill-tokens", type=common.token_size, default="4K", metavar="N",
                     help="prefills of at least N tokens count as long for interference (default 4K)")
    tap.set_defaults(func=cmd_tap)


def cmd_log_filter(args: argparse.Namespace) -> int:
    # Ctrl-C or SIGTERM (the server's pipe closing first is the usual end) stops after a whole line
    source = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", closefd=False)
    try:
        kept, dropped = logs.filter_stream(source, sys.stdout)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except BrokenPipeError:  # the reader went away: nothing more to keep
        return Exit.OK
    print(f"log-filter: kept {kept} lines, dropped {dropped}", file=common.progress(args))
    return Exit.OK


def add_log_filter(sub: common.Subparsers) -> None:
    shows = ("read llama-server's -lv 4 log on stdin, write only the numbers-only lines reusebench parses (no prompt "
             "or output text): `llama-server ... -lv 4 2>&1 | reusebench log-filter > server.log`")
    log_filter = common.add_command(sub, "log-filter", shows.split(" (")[0], shows)
    log_filter.set_defaults(func=cmd_log_filter)
