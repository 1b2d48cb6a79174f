"""Faults and bad input, end to end against the real llama-server: each gives one clear error, before or
instead of a half-run, and keeps every record written before it.

Faults are injected into the real server, not a fake one: a progress hook (called on every prompt-progress
event of the streamed completion) sends SIGKILL or SIGSTOP to the server's process group on the chosen
prefill's first event, the 0% one the server sends before its first batch, so the whole prefill is still ahead
of the server when the signal lands. A full disk is a real 64 KiB tmpfs (needs root and mount rights; skipped otherwise).
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from reusebench import cli, records, tiny
from reusebench.capability import PINNED
from reusebench.capability.build import Build
from reusebench.cli.exits import Exit
from reusebench.config import corpus, profiles, scenarios
from reusebench.llama import binaries, logs
from reusebench.machine.gpu import GpuSampler
from reusebench.records import Record, RecordWriter, Role
from reusebench.run import diagnosis, launch, recording, runner
from reusebench.run.recording import RunDir
from reusebench.run.selection import Selection
from reusebench.run.session import OnFailure, RunShared, Session

from conftest import child_llama_servers, process_group_alive

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
SIZE = 4096
CONTROL = profiles.load_profile("tiny-llama")


class Fault:
    """A progress hook that signals the server's process group on `scenario`'s first prefill event."""

    def __init__(self, sig: signal.Signals, scenario: str) -> None:
        self.sig, self.scenario = sig, scenario
        self.session: Session | None = None
        self.fired_at: tuple[int, int] | None = None
        self.pgid: int | None = None

    def __call__(self, scenario: str, step: str, role: str, processed: int, cached: int, total: int) -> None:
        if self.fired_at or scenario != self.scenario or processed >= total:
            return
        assert self.session is not None and self.session.server.process.pid is not None
        self.fired_at, self.pgid = (processed, total), self.session.server.process.pid
        os.killpg(self.pgid, self.sig)


def run_session(tmp_path: Path, fault: Fault, ids: tuple[str, ...], *,
                on_failure: OnFailure = OnFailure.STOP) -> tuple[
        Session, list[Record], str]:
    out = io.StringIO()
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer, GpuSampler() as sampler:
        control = CONTROL.variants[0]
        spec = launch.resolve(control, Build(control.binary, PINNED, binaries.help_table(control.binary)),
                              context=launch.session_context(SIZE))
        s = Session(spec, SIZE, corpus.load_spec("tiny-words"), RunShared(writer, RunDir("fault", tmp_path), sampler, out),
                    selected=scenarios.select(ids), on_failure=on_failure, progress_hook=fault)
        fault.session = s
        s.run()
    return s, records.read_records(path), out.getvalue()


# -- the server dies or hangs mid-prefill -------------------------------------------------------------


KILLED_VARIANTS = ["parallel=1,cache-ram=8192", "parallel=1,cache-ram=0"]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """kill -9 as the other document's prefill begins, in the first of two sessions of one run."""
    sys.path.insert(0, str(REPO))
    faults: list[Fault] = []

    class FaultySession(Session):
        def __init__(self, *args, **kwargs):
            first = not faults
            faults.append(Fault(signal.SIGKILL, "interleave" if first else "never"))
            super().__init__(*args, progress_hook=faults[-1], **kwargs)
            faults[-1].session = self

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REUSEBENCH_ASV_PROFILE", "tiny-probe")
        patch.setattr(runner, "Session", FaultySession)
        from benchmarks import common  # noqa: E402  (asv's module, imported as asv does)

        result = runner.run_profile(profiles.load_profile("tiny-probe"),
                                    Selection(tuple(KILLED_VARIANTS), (SIZE,), ("resend", "interleave", "reask")),
                                    results_dir=tmp_path_factory.mktemp("killed"), out=out)
    return faults[0], result, out.getvalue(), common


def test_a_server_killed_mid_prefill_fails_its_step_with_the_exit_status_and_a_scrubbed_tail(killed_run):
    fault, result, _, _ = killed_run
    assert fault.fired_at is not None and fault.fired_at[0] < fault.fired_at[1]  # killed mid-prefill
    failed = [r for r in result.records if r.error]
    assert [(r.variant, r.scenario, r.step) for r in failed] == [(KILLED_VARIANTS[0], "interleave", "other document")]
    assert failed[0].extra["exit_status"] == -signal.SIGKILL and "llama-server exited with status -9" in failed[0].error
    tail = failed[0].extra["log_tail"].splitlines()
    assert tail and all(logs.scrub_line(line) == line for line in tail)  # scrubbed: allowlisted, numbers-only lines
    assert not process_group_alive(fault.pgid)


def test_the_killed_session_stops_and_keeps_the_records_before_the_failure(killed_run):
    _, result, out, _ = killed_run
    first = [r for r in result.records if r.variant == KILLED_VARIANTS[0]]
    assert [(r.scenario, r.prompt_n is not None) for r in first if r.role == Role.MEASURE] == [
        ("first_load", True), ("resend", True)]  # intact; nothing after the failure
    assert result.failed_sessions == 1
    assert "session stopped: interleave: ClientError" in out


def test_the_next_session_of_the_run_is_complete(killed_run):
    _, result, _, _ = killed_run
    second = [r for r in result.records if r.variant == KILLED_VARIANTS[1]]
    assert {(r.scenario, r.step) for r in second if r.role == Role.MEASURE} >= {
        ("first_load", "cold"), ("resend", "same prompt"), ("interleave", "back to first"), ("reask", "new question")}
    assert not [r for r in second if r.error]


def test_asv_gets_a_failure_for_the_steps_the_killed_session_never_reached(killed_run):
    """Not a hang, not a silent n/a."""
    _, result, _, common = killed_run
    cache = common.summarise(result.records, [str(result.records_path)], result.failed_sessions)
    assert common.figure(cache, "4K", KILLED_VARIANTS[0], "resend/same prompt", "reprocessed_tokens") >= 1
    with pytest.raises(RuntimeError, match="interleave/other document: .*exited with status -9"):
        common.figure(cache, "4K", KILLED_VARIANTS[0], "reask/new question", "prefill_seconds")
    assert common.figure(cache, "4K", KILLED_VARIANTS[1], "reask/new question", "reprocessed_tokens") >= 1


def test_on_failure_continue_restarts_the_server_and_runs_the_next_scenarios(tmp_path):
    fault = Fault(signal.SIGKILL, "interleave")
    s, kept, output = run_session(tmp_path, fault, ("resend", "interleave", "reask"), on_failure=OnFailure.CONTINUE)
    assert fault.fired_at and s.result.error and s.result.error.startswith("interleave: ClientError")
    assert "going on with the next scenario" in output and "restarting the server after the failure" in output
    reask = [r for r in kept if (r.scenario, r.role) == ("reask", "measure")]
    assert len(reask) == 1 and not reask[0].error and reask[0].prompt_n
    # the first start, the restart after the failure, and one more where a reused output needed its noise band
    assert s.server.process.starts == 2 + bool(s.result.noise)


def test_hung_server_hits_a_deadline_scaled_from_the_first_load(tmp_path, monkeypatch):
    """SIGSTOP as a prefill begins: the deadline (from the first load's rate and the prompt size) fires,
    the stopped process group is killed, the failure is recorded."""
    monkeypatch.setattr(diagnosis, "HANG_FLOOR_S", 1.0)
    monkeypatch.setattr(diagnosis, "HANG_MARGIN_S", 1.0)
    monkeypatch.setattr(diagnosis, "HANG_PER_TOKEN_S", 0.0)
    fault = Fault(signal.SIGSTOP, "interleave")
    s, kept, output = run_session(tmp_path, fault, ("interleave",))
    assert fault.fired_at is not None
    hung = [r for r in kept if r.error]
    assert len(hung) == 1 and hung[0].extra["hung"] is True
    rate = kept[0].prompt_n / (kept[0].prompt_ms / 1000)  # first load: the rate the deadline is scaled from
    assert hung[0].extra["timeout_s"] == pytest.approx(4 * hung[0].prompt_tokens / rate + 1.0, abs=0.2)
    assert "timed out" in hung[0].error and "process group was killed" in hung[0].error
    assert hung[0].extra["exit_status"] == -signal.SIGKILL
    assert not process_group_alive(fault.pgid)
    waited = hung[0].ended_at - hung[0].started_at
    assert waited < 10 * hung[0].extra["timeout_s"], waited  # the deadline, then the kill; not the client's hour


def test_deadline_before_the_first_load_is_generous():
    n_predict = CONTROL.variants[0].n_predict
    # 4 x 131,072 tokens / 100 tokens/s + 30 s + 1 s per generated token: report A's slowest 128K first load took 24 min
    assert diagnosis.deadline_s(128 * 1024, None, n_predict) == 4 * 131_072 / 100 + 30 + n_predict
    assert diagnosis.deadline_s(2048, 10_000.0, n_predict) == diagnosis.HANG_FLOOR_S


# -- Ctrl-C -------------------------------------------------------------------------------------------


def test_ctrl_c_mid_prefill_keeps_the_records_stops_the_server_and_exits_130(tmp_path, monkeypatch, capsys):
    """`reusebench run`, and a real SIGINT to this process on the edited document's first prefill event: Python
    raises KeyboardInterrupt inside that call, so the interruption lands mid-prefill on any CPU."""
    servers: list[int] = []

    def ctrl_c(scenario: str, step: str, role: str, processed: int, cached: int, total: int) -> None:
        if scenario == "edit_middle" and role == "measure" and not servers:
            servers.append(session_.server.process.pid)
            os.kill(os.getpid(), signal.SIGINT)

    class InterruptedSession(Session):
        def __init__(self, *args, **kwargs):
            nonlocal session_
            super().__init__(*args, progress_hook=ctrl_c, **kwargs)
            session_ = self

    session_: Session | None = None
    monkeypatch.setattr(runner, "Session", InterruptedSession)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background `make test &` ignores it
    try:
        status = cli.main(["run", "--profile", "tiny-qwen35", "--variant", "mmproj=off,cache-reuse=0", "--size", "4K",
                           "--scenario", "edit_middle", "--results", str(tmp_path)])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert status == 130 and len(servers) == 1
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    match = re.fullmatch(r"interrupted: every server stopped; (\d+) records kept in (\S+)", summary)
    assert match, summary
    kept = records.read_records(Path(match.group(2)))
    assert len(kept) == int(match.group(1)) >= 2
    assert kept[0].scenario == "first_load" and kept[0].prompt_n
    interrupted = [r for r in kept if r.error]
    assert len(interrupted) == 1 and (interrupted[0].scenario, interrupted[0].step) == ("edit_middle", "line at 50%")
    assert interrupted[0].error == "interrupted (Ctrl-C)" and interrupted[0].prompt_tokens > 4000
    assert kept[-1].role == "session" and kept[-1].extra["timing"]["wall_s"] > 0  # the summary, written on the way out
    assert not process_group_alive(servers[0])  # stopped, not orphaned
    # the report of the cut run says so plainly, on top of what it kept
    assert cli.main(["report", str(Path(match.group(2)).parent), "--results", str(tmp_path)]) == 0
    assert "CUT SHORT: interrupted (Ctrl-C) at edit_middle/line at 50%; what it measured is kept" in (
        capsys.readouterr().out)


# -- slot files -----------------------------------------------------------------------------------------


def profile_file(tmp_path: Path, text: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"extends: {REPO / 'server_profiles' / 'tiny-llama.yaml'}\nsizes: [2048]\n{text}")
    return path


def test_slot_save_directory_under_a_regular_file_fails_before_launch(tmp_path):
    """As root, permissions do not stop a write; a path under a regular file does (ENOTDIR), for anyone."""
    (tmp_path / "plain-file").write_text("")
    slots = tmp_path / "plain-file" / "slots"
    path = profile_file(tmp_path, f"options:\n  slot-save-path: {slots}\n")
    out = io.StringIO()
    result = runner.run_profile(profiles.load_profile(path), results_dir=tmp_path, out=out)
    assert result.failed_sessions == 1 and result.records == []
    assert f"options.slot-save-path: {slots} is not a writable directory (Not a directory); nothing was started" \
        in out.getvalue()


@pytest.fixture
def full_disk(tmp_path: Path):
    mount = tmp_path / "tiny-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 64 KiB tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_while_saving_a_slot_is_named_and_leaves_no_partial_file(tmp_path, full_disk):
    path = profile_file(tmp_path, f"options:\n  slot-save-path: {full_disk}\n")
    out = io.StringIO()
    result = runner.run_profile(profiles.load_profile(path), Selection(scenario_ids=("interleave", "restore_disk")),
                                results_dir=tmp_path, out=out)
    assert result.failed_sessions == 1
    failed = [r for r in result.records if r.error]
    assert len(failed) == 1 and failed[0].step == "save slot" and failed[0].status == 500
    # the record: the call, its status and error type, and what the suite found (never the server's words)
    assert re.fullmatch(rf"POST /slots/0: HTTP 500 \(server_error\) \(slot-save directory {full_disk}: 0 bytes free "
                        r"\(disk full\); removed the partial slot file of [\d,]+ bytes\)", failed[0].error), failed[0].error
    assert "Unable to save slot" in out.getvalue()  # the console says what the server said
    assert not [r for r in result.records if r.scenario == "restore_disk"]
    assert list(full_disk.iterdir()) == []


# -- bad input: one clear error, exit status 3 (a file it reads is wrong), no server left -------------------------------------------


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(["run", *argv]) == Exit.CONFIG
    assert not child_llama_servers()
    return capsys.readouterr().err.strip()


def test_corrupt_model_is_an_error_naming_file_and_field_before_launch(tmp_path, capsys):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny.model_path("llama").read_bytes()[:100_000])
    path = profile_file(tmp_path, f"model: {broken}\n")
    err = cli_error(capsys, "--profile", str(path), "--results", str(tmp_path))
    assert re.fullmatch(rf"reusebench run: .*p\.yaml:\d+:1: model: {broken}: .*(truncated|corrupt).*", err), err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("case", ["missing", "not executable"])
def test_binary_missing_or_not_executable(tmp_path, capsys, case):
    binary = tmp_path / "llama-server"
    if case == "not executable":
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o644)
    path = profile_file(tmp_path, f"binary: {binary}\n")
    err = cli_error(capsys, "--profile", str(path), "--results", str(tmp_path))
    assert re.fullmatch(rf"reusebench run: .*p\.yaml:\d+:1: binary: {binary} ({'does not exist' if case == 'missing' else 'is not executable'})", err), err


@pytest.mark.parametrize(("text", "message"), [
    ("options: {parallel: 1\n", r"p\.yaml:\d+:\d+: invalid YAML: "),
    ("n_predict: eight\n", r"p\.yaml:\d+:1: n_predict: expected an integer"),
])
def test_malformed_profile_is_exit_3_naming_file_and_field(tmp_path, capsys, text, message):
    path = profile_file(tmp_path, text)
    err = cli_error(capsys, "--profile", str(path), "--results", str(tmp_path))
    assert re.search(message, err), err


def test_corpus_smaller_than_the_size_is_an_error_naming_file_and_sizes(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("\n".join(" the river and the bridge" for _ in range(50)))
    spec = tmp_path / "short.yaml"
    spec.write_text("source: file\npath: short.txt\nquestions: [' what is it', ' where is it']\n"
                    "edit: ' a new line'\nsummary: ' a summary'\n")
    err = cli_error(capsys, "--profile", "tiny-llama", "--size", "2048", "--scenario", "resend",
                    "--corpus", str(spec), "--results", str(tmp_path))
    assert re.search(rf"short\.yaml: path: corpus file {text} has \d+ tokens, fewer than the requested size of 2,048",
                     err), err


# -- records ---------------------------------------------------------------------------------------------


def test_a_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "records.jsonl"
    whole = Record(run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=1, scenario="x",
                   step="y", role="measure", endpoint="/completion", started_at=0.0, ended_at=1.0, prompt_n=5)
    with RecordWriter(path) as writer:
        writer.write(whole)
        writer.write(whole)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # power loss in the middle of the second line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = records.read_records(path)
    assert [r.prompt_n for r in back] == [5]
    assert any("records.jsonl:2: skipped a damaged record line" in str(w.message) for w in caught)


def test_a_second_run_never_overwrites_the_first(tmp_path):
    ids = {recording.new_run_id() for _ in range(20)}
    assert len(ids) == 20
    first = tmp_path / "runs" / next(iter(ids))
    first.mkdir(parents=True)
    with pytest.raises(FileExistsError):
        first.mkdir(parents=True, exist_ok=False)  # what run_profile does with its directory
