"""A guard for the whole test session: no llama-server started by the tests may outlive them."""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from reusebench.config import profiles
from reusebench.llama import binaries
from reusebench.llama.process import ServerProcess
from reusebench.records import Record, Role
from reusebench.run import runner
from reusebench.run.selection import Selection

REPORT_A_SIZE = 2048  # report A's steps in the tests: small enough for two cores, past every checkpoint offset
REPORT_A = ("first_load", "resend", "interleave", "reask", "edit_middle", "restore_disk")
SLOW_MACHINE_S = 1000.0  # what a call or a wait in a test may take on a loaded machine: under pytest's 1,200 s timeout


def children(pid: int, name: str) -> list[int]:
    """Processes whose parent is `pid` and whose program is called `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid and argv0.endswith(name.encode()):
                found.append(int(entry.name))
    return found


def child_llama_servers() -> set[int]:
    """llama-server processes whose parent is this test process (servers run in their own process group)."""
    return set(children(os.getpid(), "llama-server"))


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still exists (signal 0 checks without sending)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job cancelled, `timeout`) stops the tests as Ctrl-C does, so every fixture's server is stopped;
    Python's default would end the process with its servers left running."""
    def terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)


@pytest.fixture(autouse=True)
def _servers_only_in_e2e(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked e2e may not start llama-server (a capability probe on a cold cache included): `make
    check` runs the unmarked ones as the tier that starts no server, so a wrong mark fails here, not by a slow
    check."""
    if request.node.get_closest_marker("e2e") is None:
        def refused(self: ServerProcess) -> ServerProcess:
            raise AssertionError(f"{request.node.nodeid} starts llama-server ({' '.join(self.args[:2])}): mark it "
                                 "e2e")
        monkeypatch.setattr(ServerProcess, "start", refused)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leaked = child_llama_servers()
    if leaked:
        print(f"\nFAILED: llama-server processes outlived the tests: {sorted(leaked)}")
        for pid in leaked:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        session.exitstatus = 1


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def default_llama_server() -> Path:
    """The llama-server profiles call `default`: the portable build of the pinned llama.cpp release
    (`make setup` builds it; the tests fail with that instruction if it is missing)."""
    return binaries.resolve_binary("default", source="tests").path


@contextmanager
def raw_server(model: Path, *args: str, log_verbosity: int = 4) -> Iterator[tuple[httpx.Client, Path]]:
    """The default llama-server on `model` (one slot, small batches so checkpoints land close together),
    started and stopped by reusebench's ServerProcess; yields a plain httpx client that carries the API key, and
    the raw log (deleted when the server stops, so read it inside the block)."""
    args = ("-m", str(model), "-c", "16384", "-np", "1", "-ub", "64", "-b", "256", *args)
    server = ServerProcess(default_llama_server(), args, log_verbosity=log_verbosity)
    headers = {"Authorization": f"Bearer {server.api_key}"}
    # no timing margin: on two cores taken by other work a 2 s request took over 60 s (ggml's threads wait on each
    # other); pytest's timeout still bounds the test
    with server, httpx.Client(base_url=server.base_url, headers=headers, timeout=SLOW_MACHINE_S) as client:
        yield client, server.raw_log_path


def heed_ctrl_c() -> None:
    """In the child: SIGINT back to its default, so Python installs its Ctrl-C handler. A shell starts a
    background job (`make test &`) with SIGINT ignored, and its children inherit that: they would not stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)



def report_a(profile: str, variant: str, results: Path) -> dict[tuple[str, str], Record]:
    """Report A's six steps on one variant at REPORT_A_SIZE: the measured records by (scenario, step)."""
    result = runner.run_profile(profiles.load_profile(profile), Selection((variant,), (REPORT_A_SIZE,), tuple(REPORT_A)),
                                results_dir=results, out=io.StringIO())
    assert result.failed_sessions == 0
    return {(r.scenario, r.step): r for r in result.records if r.role == Role.MEASURE}
