"""A guard for the whole test session: no llama-server started by the tests may outlive them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest


def child_llama_servers() -> set[int]:
    """llama-server processes whose parent is this test process (servers run in their own process group)."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and argv0.endswith(b"llama-server"):
            found.add(int(entry.name))
    return found


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still exists (signal 0 checks without sending)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


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
