"""The one wait for sleep that `run` and `check` share (Server.wait_until_asleep), without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reusebench.llama import server
from reusebench.llama.process import ServerError, ServerProcess
from reusebench.llama.server import Server


class SleepyClient:
    """Answers /props with is_sleeping true from the `asleep_at`-th call on; counts every other call."""

    def __init__(self, asleep_at: int | None) -> None:
        self.asleep_at, self.props_calls, self.other_calls = asleep_at, 0, 0

    def props(self) -> dict[str, Any]:
        self.props_calls += 1
        return {"is_sleeping": self.asleep_at is not None and self.props_calls >= self.asleep_at}

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # anything else would wake the server
        self.other_calls += 1
        raise AssertionError(f"{name} called while waiting for sleep")


def handle_with(client: SleepyClient, tmp_path: Path) -> Server:
    server_handle = Server(ServerProcess(tmp_path / "llama-server", []), call_timeout_s=1.0)
    server_handle._client = client  # type: ignore[assignment]  # what start() would set on a running server
    return server_handle


class Clock:
    """the server module's `time`: a sleep advances it by exactly its length, so waits are arithmetic, not the CPU's pace."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    monkeypatch.setattr(server, "SLEEP_POLL_S", 0.125)  # binary fractions: the sums below are exact
    monkeypatch.setattr(server, "time", Clock())
    return server.time


def test_waits_until_props_says_asleep_asking_nothing_else(tmp_path: Path) -> None:
    client = SleepyClient(asleep_at=3)
    waited = handle_with(client, tmp_path).wait_until_asleep(5.0)
    assert waited.asleep and waited.polls == 3 and waited.waited_s == 0.25 and client.other_calls == 0  # two polls


def test_gives_up_after_the_limit_and_one_grace_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "SLEEP_GRACE_S", 0.25)
    client = SleepyClient(asleep_at=None)
    waited = handle_with(client, tmp_path).wait_until_asleep(0.5)
    # limit 0.5 + grace 0.25 = 0.75 s; polls every 0.125 s: at 0.75 it is not yet over, at 0.875 it gives up
    assert not waited.asleep and waited.waited_s == 0.875 and waited.polls == client.props_calls == 8


def test_no_client_before_start(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="not running"):
        _ = Server(ServerProcess(tmp_path / "llama-server", []), call_timeout_s=1.0).client
