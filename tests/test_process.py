"""Server lifecycle against the real llama-server: start, faults, stop, restart."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reusebench import tiny
from reusebench.llama.client import ClientError, LlamaClient
from reusebench.llama.process import ServerError, ServerProcess
from reusebench.llama.server import Server

from conftest import SLOW_MACHINE_S, default_llama_server, process_group_alive

pytestmark = pytest.mark.e2e


def make_server(*args: str, model: Path | None = None, **kwargs) -> ServerProcess:
    model = model or tiny.model_path("llama")
    return ServerProcess(default_llama_server(), ["-m", str(model), "-c", "4096", "-np", "1", *args], **kwargs)


def words(n: int) -> str:
    return " ".join(tiny.WORDS[i % len(tiny.WORDS)] for i in range(n))


def test_start_binds_loopback_with_an_api_key_and_stop_kills_the_group():
    server = make_server().start()
    try:
        assert server.base_url.startswith("http://127.0.0.1:")
        pid = server.pid
        with LlamaClient(server.base_url) as anonymous:
            with pytest.raises(ClientError) as denied:
                anonymous.tokenize("the")
        assert denied.value.status == 401
        with LlamaClient(server.base_url, server.api_key) as client:
            assert client.tokenize(" the river") and client.props()["total_slots"] == 1
    finally:
        server.close()
    assert not process_group_alive(pid)
    assert not server.raw_log_path.exists()  # the private raw log goes with the server


def test_port_already_taken_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=f"couldn't bind.*{port}"):
            make_server(port=port).start()


def test_corrupt_model_fails_start_up_with_exit_status_and_log_tail(tmp_path):
    # llama-server sometimes exits before its log thread writes the loader's error line, so the
    # cause itself is checked before launch (profiles: gguf header check); here: no hang, a clear exit.
    model = tmp_path / "broken.gguf"
    model.write_bytes(tiny.model_path("llama").read_bytes()[:100_000])  # truncated
    with pytest.raises(ServerError, match="exited with status 1 during start-up; last log lines:"):
        make_server(model=model).start()


def test_missing_binary_is_named(tmp_path):
    server = ServerProcess(tmp_path / "llama-server", ["-m", "x.gguf"])
    with pytest.raises(ServerError, match="missing or not executable: .*llama-server"):
        server.start()


def test_restart_keeps_the_slot_save_directory(tmp_path):
    server = make_server("--slot-save-path", str(tmp_path)).start()
    try:
        with LlamaClient(server.base_url, server.api_key) as client:
            client.complete(words(300), n_predict=4)
            assert client.slot_save(0, "kept.bin")["n_saved"] > 300
        server.restart()
        with LlamaClient(server.base_url, server.api_key) as client:
            assert client.slot_restore(0, "kept.bin")["n_restored"] > 300
            assert client.complete(words(300), n_predict=4).prompt_n == 1
    finally:
        server.close()


def test_a_call_slowed_down_but_progressing_is_not_hung(monkeypatch: pytest.MonkeyPatch):
    """A loaded machine: every step of a long prefill takes a while, the whole call far more than the deadline.
    The client's clock moves one second per look, so the call outlasts its 3 s deadline many times over."""
    import reusebench.llama.client as client_module

    class Busy:
        now = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            cls.now += 1.0
            return cls.now

    server = make_server("-b", "64", "-ub", "64").start()
    try:
        with LlamaClient(server.base_url, server.api_key) as client:
            monkeypatch.setattr(client_module, "time", Busy)
            # 640 words in batches of 64: 10 progress events, then 4 tokens, each a step on
            done = client.complete(words(640), n_predict=4, timeout_s=3)
            assert done.prompt_n > 640 and Busy.now > 3 * 3
    finally:
        server.close()


def test_hung_server_times_out_and_is_still_stopped():
    server = make_server().start()
    try:
        with LlamaClient(server.base_url, server.api_key) as client:
            os.killpg(server.pid, signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(ClientError, match="timed out"):
                client.complete(words(200), n_predict=4, timeout_s=2)
            assert time.monotonic() - started < 20  # the 2 s bound, not the client's default hour
        pgid = server.pid
    finally:
        server.close()
    assert not process_group_alive(pgid)


def test_server_killed_mid_prefill_fails_the_call_with_its_exit_status():
    server = make_server().start()
    try:
        with LlamaClient(server.base_url, server.api_key) as client:
            def kill_mid_prefill(processed: int, cache: int, total: int) -> None:
                # the server's 0% event, sent before its first batch: the whole prefill is still ahead of it
                if processed < total and server.is_running():
                    server.kill_hard()

            with pytest.raises(ClientError, match="connection|no answer|closed"):
                client.complete(words(3500), n_predict=4, on_progress=kill_mid_prefill)
        assert server.popen is not None and server.popen.wait(timeout=60) == -signal.SIGKILL
    finally:
        server.close()


def test_handle_restart_gets_a_client_on_the_new_port_and_reads_the_log_by_mark():
    handle = Server(make_server(), call_timeout_s=30.0).start()
    try:
        first_client = handle.client
        mark = handle.mark()
        handle.client.complete(words(64), n_predict=2)
        assert any(event.kind == "new_prompt" for event in handle.events_since(mark))
        handle.restart()
        assert handle.client is not first_client and handle.process.starts == 2
        assert handle.client.props()["total_slots"] == 1  # the new client reaches the restarted server
        assert handle.events_since(handle.mark()) == []
        raw_log = handle.process.raw_log_path
    finally:
        handle.close()
    assert not raw_log.exists()
    with pytest.raises(ServerError, match="not running"):
        _ = handle.client


def test_tests_stopped_by_sigterm_leave_no_server_and_no_raw_log(tmp_path: Path):
    # a test that holds a server, its pytest sent SIGTERM (as a cancelled CI job or `timeout` does): the server
    # stops, and its raw log (-lv 4 may carry prompt text) goes with it
    (tmp_path / "test_holds.py").write_text(
        "import time\nfrom pathlib import Path\nimport pytest\nfrom test_process import make_server\n\n"
        "@pytest.mark.e2e\ndef test_holds():\n    with make_server() as server:\n"
        f"        Path({str(tmp_path / 'log')!r}).write_text(str(server.raw_log_path))\n"
        f"        Path({str(tmp_path / 'pid')!r}).write_text(str(server.pid))\n        time.sleep(600)\n")
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{tests}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                              "--rootdir", str(tmp_path), str(tmp_path / "test_holds.py")], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SLOW_MACHINE_S
        while not (tmp_path / "pid").exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        pgid = int((tmp_path / "pid").read_text())
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) != 0
        left = process_group_alive(pgid)
    finally:
        if child.poll() is None:
            child.kill()
        if (tmp_path / "pid").exists() and process_group_alive(int((tmp_path / "pid").read_text())):
            os.killpg(int((tmp_path / "pid").read_text()), signal.SIGKILL)  # what the assert below reports
    assert not left
    raw_log = Path((tmp_path / "log").read_text())
    assert not raw_log.exists() and not raw_log.parent.exists()


def test_a_server_object_never_closed_leaves_no_private_directory():
    # made, started and stopped, never closed (a driver that lost it): its directory goes with the object
    server = make_server().start()
    private = server.raw_log_path.parent
    server.stop()
    assert private.exists()
    del server
    gc.collect()
    assert not private.exists()


def test_a_starter_killed_outright_takes_its_server_with_it(tmp_path: Path):
    # SIGKILL runs no handler and no atexit (asv ending a benchmark, the OOM killer): the kernel's parent-death
    # signal is what stops the server then
    script = ("import os, signal, sys\nfrom pathlib import Path\nfrom test_process import make_server\n"
              f"server = make_server().start()\nPath({str(tmp_path / 'pid')!r}).write_text(str(server.pid))\n"
              f"Path({str(tmp_path / 'log')!r}).write_text(str(server.raw_log_path.parent))\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    starter = subprocess.run([sys.executable, "-c", script], env=env, timeout=SLOW_MACHINE_S)
    assert starter.returncode == -signal.SIGKILL
    pgid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + SLOW_MACHINE_S  # it stops at once; only a server that never stops reaches this
    while process_group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = process_group_alive(pgid)
    if left:
        os.killpg(pgid, signal.SIGKILL)  # what the assert below reports
    # nothing ran to delete the raw log after SIGKILL: the test removes what its starter left
    shutil.rmtree((tmp_path / "log").read_text(), ignore_errors=True)
    assert not left
