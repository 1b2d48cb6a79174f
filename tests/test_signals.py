"""Ctrl-C and SIGTERM at a generated moment in every command that starts a server: exit 130, every server
stopped, no traceback, and the run's records whole.

Each command runs as its own process, as a user runs it. The moment is drawn by hypothesis (seeded, so CI
repeats it): after the command's k-th line of progress (or, where it prints fewer, once it has been quiet for a
while: a long prefill, a relay waiting for clients), and a delay after it. A moment counted in lines lands at
about the same point of the command on any machine, loaded or not, and any moment must stop it cleanly. Where
the command ends before the moment comes, the example tells nothing and another is drawn.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from conftest import heed_ctrl_c

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
TRACE = ["mooncake-conversation", "--scale", "16", "--limit", "6"]
COMMANDS = {  # each starts at least one llama-server; small enough to run in seconds
    "run": ["run", "--profile", "tiny-qwen35", "--size", "2K", "--scenario", "resend", "--scenario", "reask"],
    "check": ["check", "--profile", "tiny-llama", "--option", "cache-ram", "--option", "ctx-checkpoints"],
    "workload": ["workload", "service-small", "--through-tap"],
    "replay": ["replay", *TRACE, "--profile", "tiny-qwen35"],
    "whatif": ["whatif", *TRACE, "--profile", "tiny-qwen35", "--try", "cache-ram=0", "--verify", "1", "--rate", "1000"],
    "tap": ["tap", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"],
    "fuzz": ["fuzz", "--family", "hybrid", "--cases", "40", "--seed", "1", "--no-outputs"],
}
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXAMPLES = 2  # per command: a CI run; the seed makes them the same every time
WAIT_S = 600.0  # a command's whole run on two busy cores: only a hung command reaches it
QUIET_S = 3.0  # no new line for this long: the command is in a long step (or waiting), a moment as good as any


def servers_marked(marker: str) -> list[int]:
    """llama-server processes whose environment carries `marker`: the command's, wherever they were reparented."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() == "llama-server" and marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def exiting(pid: int) -> bool:
    """Whether the process is on its way out in the kernel (PF_EXITING) or gone: a signal then lands on nothing."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in "ZX" or bool(int(fields[6]) & 0x4)


def signalled(command: list[str], results: Path, lines: int, delay_s: float, signum: int) -> tuple[int, str, bool]:
    """Run `command`, send `signum` after its `lines`-th stderr line and `delay_s`; (exit status, stderr, whether
    the signal was sent before it ended)."""
    marker = f"REUSEBENCH_SIGNAL_TEST={uuid.uuid4().hex}"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
    child = subprocess.Popen([sys.executable, "-m", "reusebench", *command, "--results", str(results)], cwd=REPO,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True,  # a signal to it alone, as a terminal's Ctrl-C to a job
                             preexec_fn=heed_ctrl_c)
    err: list[str] = []
    reached = threading.Event()
    last_line = [time.monotonic()]

    def read() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            err.append(line)
            last_line[0] = time.monotonic()
            if len(err) >= lines:
                reached.set()
        reached.set()  # it ended before that line

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    while not reached.wait(0.1) and time.monotonic() - last_line[0] < QUIET_S and time.monotonic() - started < WAIT_S:
        pass
    time.sleep(delay_s)
    sent = child.poll() is None
    if sent:
        child.send_signal(signum)
        # a process that had already called exit reads as running until the kernel is done with it (ms on a busy
        # machine): the signal came after the command ended, and the example tells nothing
        sent = not exiting(child.pid)
    status = child.wait(WAIT_S)
    reader.join(WAIT_S)
    time.sleep(0.5)  # a server stopped at exit is gone from /proc a moment later
    leaked = servers_marked(marker.split("=")[1])
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    assert not leaked, f"llama-server left running: {leaked}"
    return status, "".join(err), sent


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_signal_at_any_moment_stops_the_command_cleanly(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    @seed(20261206)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(lines=st.integers(1, 12), delay_s=st.sampled_from([0.0, 0.05, 0.3, 1.5]), signum=st.sampled_from(SIGNALS))
    def one(lines: int, delay_s: float, signum: int) -> None:
        results = tmp_path_factory.mktemp(name)
        status, err, sent = signalled(COMMANDS[name], results, lines, delay_s, signum)
        assume(sent)
        assert "Traceback" not in err, err[-3000:]
        # a relay's Ctrl-C is how it ends (a service's SIGTERM too): once it relays, its stop is a clean exit 0
        relaying = name == "tap" and "relaying" in err
        assert status == (0 if relaying else 130), (status, err[-3000:])
        assert relaying or "interrupted" in err.lower(), err[-2000:]
        for records in results.rglob("records.jsonl"):  # whole lines only: nothing measured is cut in half
            assert all(line.endswith("}") for line in records.read_text().splitlines())
        for summary in results.rglob("fuzz.json"):  # the family it was in is kept with the cases it played
            kept = json.loads(summary.read_text())
            flags = [f["interrupted"] for f in kept["families"]]
            # a signal after the summary was written (the fuzz done, the command not yet exited) leaves it whole
            assert flags in ([], [True]) if kept["interrupted"] else not any(flags), kept

    one()


AS_IT_ENDS = """
import atexit, os, signal, sys, weakref
import reusebench.__main__, reusebench.cli

def command(argv=None):
    if sys.argv[1] == "in-a-callback":  # its KeyboardInterrupt is raised where Python cannot raise it
        class Thing: pass
        def gone(ref):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # a few bytecodes: Python runs the handler here, inside the callback
        thing = Thing(); ref = weakref.ref(thing, gone); del thing
    else:  # after the command returned, while the exit handlers run
        atexit.register(os.kill, os.getpid(), signal.SIGTERM)
    print("done", file=sys.stderr)
    return 0

reusebench.cli.main = command
sys.exit(reusebench.__main__.entry())
"""


@pytest.mark.parametrize("where", ["in-a-callback", "at-exit"])
def test_a_signal_as_the_command_ends_still_exits_130_and_says_so(where: str) -> None:
    # the generated moments above land here only by chance; these two land here every time
    done = subprocess.run([sys.executable, "-c", AS_IT_ENDS, where], cwd=REPO, capture_output=True, text=True,
                          timeout=60, preexec_fn=heed_ctrl_c)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.startswith("done\n") and "interrupted as it ended" in done.stderr, done.stderr
