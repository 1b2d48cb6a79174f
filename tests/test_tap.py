"""The tap in front of a real llama-server: the small service workload through it gives the workload's own counts,
cause by cause; an OpenAI-style chat client's turns come out classed; a planted marker reaches no file the tap or
the log filter wrote; a client that leaves cancels the server's task; a tap stopped or killed mid-stream loses no
record and leaves none half-written."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from reusebench import listening, records, tiny
from reusebench.capability import build
from reusebench.config import profiles, users, workload
from reusebench.llama.process import ServerProcess
from reusebench.llama.task_log import TaskLog
from reusebench.records import Record, Role
from reusebench.report import service_report
from reusebench.run import provenance
from reusebench.run.recording import RunDir
from reusebench.run.service import resolve_for_workload, service_run
from reusebench.tap import InFront, Tap, TapOptions

from conftest import default_llama_server, heed_ctrl_c

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
MARKER = " ".join(tiny.WORDS[i] for i in (201, 57, 188, 143, 99, 176, 132, 66, 207, 121, 160, 83))


def words(start: int, n: int) -> str:
    return " ".join(tiny.WORDS[(start + 7 * i) % len(tiny.WORDS)] for i in range(n))


def calls(kept: list[Record]) -> list[Record]:
    return sorted((r for r in kept if r.role in (Role.MEASURE, Role.PROBE)), key=lambda r: r.started_at)


def read_clean(path: Path) -> list[Record]:
    """The records, failing on any damaged line (the reader would only warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return records.read_records(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def through_tap(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Record], list[Record]]:
    """The small workload on the serial schedule, its users talking to the server through a tap."""
    tmp = tmp_path_factory.mktemp("through-tap")
    load = workload.load_workload("service-small")
    variant = profiles.load_profile(load.profile).variants[0]
    via = InFront(tmp / "taps", long_prefill_tokens=load.long_prefill_tokens, key_file=tmp / "tap.key")
    writer = records.RecordWriter(tmp / "records.jsonl")
    with writer:
        service_run(load, resolve_for_workload(variant, build.of(variant.binary), load), writer, run=RunDir("t", tmp),
                    via=via, out=io.StringIO()).run()
    (tapped,) = via.runs
    return records.read_records(tmp / "records.jsonl"), read_clean(tapped / "records.jsonl")


def test_the_workload_through_the_tap_gives_its_own_counts_cause_by_cause(through_tap) -> None:
    own, tapped = through_tap
    mine, seen = calls(own), calls(tapped)
    assert len(mine) == len(seen) == own[-1].extra["requests"] and not [r.error for r in seen if r.error]
    # request by request: the class (the health check is "unrelated" to the tap), the turn's place, the ideal, the
    # counts, the slot and the cause the log gave
    def same(r: Record) -> tuple:
        step = users.UNRELATED if r.step == users.HEALTH_CHECK else r.step
        return (step, r.role, r.prompt_tokens, r.ideal, r.prompt_n, r.cache_n, r.slot, r.lora, r.cause)
    for a, b in zip(mine, seen):
        assert same(a) == same(b), (a.user, a.turn, same(a)[:-1], same(b)[:-1], {
            k: (v, (b.cause or {}).get(k)) for k, v in (a.cause or {}).items() if v != (b.cause or {}).get(k)})
    # conversations map one to one onto the users, turn by turn
    pairs = {(a.user, b.user) for a, b in zip(mine, seen) if a.role == Role.MEASURE}
    assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs}) == 5
    assert [r.turn for r in mine if r.role == Role.MEASURE] == [r.turn for r in seen if r.role == Role.MEASURE]
    # and so the report: every count figure, the miss table and the causes
    counts = [name for name in service_report.MISS_FIGURES]
    assert [service_report.figures(own)[n] for n in counts] == [service_report.figures(tapped)[n] for n in counts]
    # (the workload's table has the reuse model's expected misses beside; the tap's predicts nothing)
    assert service_report.miss_table([replace(t, expected=None) for t in service_report.turns(own)]) == \
        service_report.miss_table(service_report.turns(tapped))
    assert service_report.cause_table(service_report.turns(own)) == service_report.cause_table(
        service_report.turns(tapped))
    assert service_report.miss_causes(service_report.turns(tapped))  # report B's LoRA clear shows
    summary = tapped[-1]
    assert summary.role == Role.SESSION and summary.extra["sleeps"] == own[-1].extra["sleeps"] == 1
    # the tap knows the opening every conversation shares only from the traffic: the system prompt, and here the
    # first word of every user's opening too
    assert summary.extra["system_prompt_tokens"] >= own[-1].extra["system_prompt_tokens"]
    assert summary.extra["without_task"] == summary.extra["length_mismatches"] == 0


def converse(tmp: Path, args: tuple[str, ...]) -> dict:
    """A chat client's conversation through the tap, the server at verbosity 9 (which logs prompts), its log
    through `reusebench log-filter` into the file the tap reads."""
    server = ServerProcess(default_llama_server(), (*args, "-c", "8192", "-np", "1"), log_verbosity=9)
    filtered = tmp / "server.log"
    found: dict = {"tmp": tmp, "filtered": filtered}
    with server:
        with open(filtered, "w") as sink:
            follow = subprocess.Popen(f"tail -F -n +1 {server.raw_log_path} | {sys.executable} -m reusebench log-filter",
                                      shell=True, stdout=sink, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            tap = Tap(TapOptions(upstream=server.base_url, listen=("127.0.0.1", 0), results=tmp / "results",
                                 key_file=tmp / "key" / "tap.key", server_log=filtered))
            url = tap.start()
            auth = {"Authorization": f"Bearer {server.api_key}"}
            with httpx.Client(base_url=url, timeout=120) as client:
                def chat(messages: list[dict], stream: bool = False) -> str:
                    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": stream}
                    response = client.post("/v1/chat/completions", json=body, headers=auth)
                    assert response.status_code == 200, response.text
                    if not stream:
                        return response.json()["choices"][0]["message"]["content"]
                    chunks = [json.loads(line[5:]) for line in response.text.splitlines()
                              if line.startswith("data:") and "[DONE]" not in line]
                    return "".join((c["choices"][0].get("delta") or {}).get("content") or ""
                                   for c in chunks if c.get("choices"))

                messages = [{"role": "user", "content": words(1, 40) + " " + MARKER + " " + words(3, 20)}]
                answer = chat(messages)
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": words(5, 10)}]
                answer = chat(messages, stream=True)
                chat(messages)  # the same turn again: regenerate
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": words(9, 10)}]
                chat([{"role": "system", "content": words(13, 30)}] + messages)  # a summary at the head
                found["refused"] = client.post("/v1/chat/completions", json={"messages": messages}).status_code
                found["health"] = client.get("/health").status_code
            found["summary"] = tap.stop("the test ended")
            found["run"] = tap.run_dir.path
            found["raw_log_has_marker"] = MARKER in server.raw_log_path.read_text(errors="replace")
        finally:
            os.killpg(follow.pid, signal.SIGTERM)
            follow.wait()
    found["records"] = read_clean(found["run"] / "records.jsonl")
    return found


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return converse(tmp_path_factory.mktemp("chat"), ("-m", str(tiny.model_path("llama"))))


@pytest.fixture(scope="module")
def gemma_chat(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same conversation on the real Gemma 3 270M, in its own template (the system message folds into the
    first user turn, the assistant is `model`)."""
    return converse(tmp_path_factory.mktemp("gemma-chat"),
                    tuple(profiles.load_profile("gemma3-270m").variants[0].server_args()))


def chat_turns(run: dict) -> list[Record]:
    return [r for r in run["records"] if r.role == Role.MEASURE and r.status == 200]


@pytest.mark.parametrize("conversation", ["chat_run", "gemma_chat"])
def test_a_chat_clients_turns_are_classed(conversation: str, request: pytest.FixtureRequest) -> None:
    turns = chat_turns(request.getfixturevalue(conversation))
    # first; the answer and a question; the same again; a system message at the head of the whole history
    assert [(r.step, r.user, r.turn) for r in turns] == [
        ("first", "conv-1", 1), ("continues", "conv-1", 2), ("regenerate", "conv-1", 3), ("head insert", "conv-1", 4)]
    for r in turns:  # the tap's count is the server's, BOS included; the slot and the cause come from the log
        assert r.prompt_tokens == r.prompt_n + r.cache_n and "length_mismatch" not in r.extra, r
        assert r.slot == 0 and r.cause is not None and r.cause["slot"] == 0, r
    first, continues, regenerate, head = turns
    # the tap's perfect cache holds turn 1 and its answer, seen again in turn 2's prompt
    assert continues.extra["diverges_at"] == first.prompt_tokens + first.predicted_n
    assert regenerate.ideal == 1 and head.extra["inserted"] > 0
    # everything after the template's first tokens (BOS, the role's opening) moved: nothing more was seen before
    assert head.ideal == head.prompt_tokens - head.extra["diverges_at"] and head.extra["diverges_at"] <= 4


def test_the_slot_keeps_a_chat_turn_and_its_answer(chat_run) -> None:
    _, continues, regenerate, _ = chat_turns(chat_run)
    # the server re-processes one more than the ideal: the last generated token was never evaluated
    assert continues.prompt_n == continues.ideal + 1 and continues.verdict == "hit"
    assert regenerate.prompt_n == 1


def test_a_sliding_window_chat_returns_to_the_checkpoint_before_the_last_prompts_end(gemma_chat) -> None:
    first, continues, regenerate, _ = chat_turns(gemma_chat)
    # The whole history is shorter than the 512-token window: the cache's pos_min (0) is not below the threshold
    # max(0, pos_next - n_swa) = 0, so b11434 looks for a checkpoint instead of keeping the live state. It takes
    # the one 4 tokens before the last prompt's end and keeps n_tokens - 1 of it.
    assert continues.cache_n == first.prompt_tokens - 4 - 1 and continues.verdict == "partial"
    assert regenerate.cache_n == continues.prompt_tokens - 4 - 1 and regenerate.prompt_n == 5


def test_credentials_pass_through_and_other_endpoints_are_counted_unrecorded(chat_run) -> None:
    assert chat_run["refused"] == 401 and chat_run["health"] == 200
    refused = [r for r in chat_run["records"] if r.status == 401]
    assert len(refused) == 1 and refused[0].error and refused[0].prompt_n is None
    assert chat_run["summary"].extra["unrecorded"] == {"GET /health": 1}
    # four prompts tokenized; the refused one could not be, without the key
    assert chat_run["summary"].extra["tokenize"]["calls"] == 4 and chat_run["summary"].extra["unclassed"] == 1


def test_the_marker_reaches_no_file_the_tap_or_the_filter_wrote(chat_run) -> None:
    assert chat_run["raw_log_has_marker"]  # at -lv 9 the server logs prompts: the filter had something to drop
    written = [p for p in chat_run["tmp"].rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"records.jsonl", "server.log", "tap.key"} <= names
    assert chat_run["filtered"].stat().st_size > 0
    half = " ".join(MARKER.split()[3:9])
    for path in written:
        text = path.read_bytes().decode("utf-8", errors="replace")
        assert MARKER not in text and half not in text, path
    assert not list((chat_run["tmp"] / "results").rglob("*.key"))  # the key is outside the results


@pytest.fixture
def server_and_log(tmp_path: Path):
    model = tiny.model_path("llama")
    server = ServerProcess(default_llama_server(), ("-m", str(model), "-c", "32768", "-np", "1"), log_verbosity=4)
    with server:
        yield server


def stream_some(url: str, server: ServerProcess, chunks: int, n_predict: int = 20000):
    """Start a long streamed completion and read `chunks` of it; returns the open stream's context."""
    client = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {server.api_key}"})
    body = {"prompt": words(2, 50), "n_predict": n_predict, "ignore_eos": True, "stream": True, "temperature": 0}
    stream = client.stream("POST", "/completion", json=body)
    response = stream.__enter__()
    lines = response.iter_lines()
    seen = 0
    while seen < chunks:
        if next(lines).startswith("data:"):
            seen += 1
    return client, stream, lines


def test_a_client_that_leaves_cancels_the_servers_task(server_and_log, tmp_path: Path) -> None:
    server = server_and_log
    tap = Tap(TapOptions(upstream=server.base_url, listen=("127.0.0.1", 0), results=tmp_path / "results",
                         key_file=tmp_path / "tap.key", server_log=server.raw_log_path))
    url = tap.start()
    try:
        client, stream, _ = stream_some(url, server, chunks=5)
        stream.__exit__(None, None, None)  # the client goes away with 20,000 tokens asked for
        client.close()
        task = TaskLog(server.raw_log_path).claim(0, 51, wait_s=120)  # BOS and 50 words, up to its release
        assert task is not None
        released = [e for e in task.events if e.kind == "stop_processing"]
        # the server stopped the task long before its 20,000 tokens: it saw the client's disconnect through the tap
        assert released and released[0].fields["n_tokens"] < 51 + 20000, task.events[-3:]
    finally:
        summary = tap.stop("the test ended")
    (record,) = [r for r in read_clean(tap.run_dir.records_path) if r.role == Role.MEASURE]
    assert record.error == "client disconnected" and summary.extra["interrupted"] == 0


@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL])
def test_a_tap_stopped_mid_stream_loses_no_record(server_and_log, tmp_path: Path, kill: signal.Signals) -> None:
    server = server_and_log
    port = free_port()
    tap = subprocess.Popen(
        [sys.executable, "-m", "reusebench", "tap", "--upstream", server.base_url, "--listen", f"127.0.0.1:{port}",
         "--server-log", str(server.raw_log_path), "--results", str(tmp_path / "results"), "--key-file",
         str(tmp_path / "tap.key")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=heed_ctrl_c)
    try:
        url = f"http://127.0.0.1:{port}"
        assert listening.wait_listening(url + "/health", lambda: tap.poll() is None), "the tap did not start"
        auth = {"Authorization": f"Bearer {server.api_key}"}
        done = httpx.post(url + "/completion", json={"prompt": words(4, 60), "n_predict": 4}, headers=auth, timeout=60)
        assert done.status_code == 200
        client, stream, lines = stream_some(url, server, chunks=3)
        tap.send_signal(kill)
        with pytest.raises(httpx.HTTPError):  # the client sees its answer end early
            for line in lines:
                assert '"stop":true' not in line.replace(" ", "")
        stream.__exit__(None, None, None)
        client.close()
        output, _ = tap.communicate(timeout=60)
    finally:
        if tap.poll() is None:
            tap.kill()
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert provenance.read(run).kind == "tap"  # its run.json names what it is, though it launched nothing
    kept = read_clean(run / "records.jsonl")  # every line whole
    assert kept[0].role == Role.MEASURE and kept[0].status == 200 and kept[0].prompt_n == 61 and not kept[0].error
    if kill == signal.SIGTERM:  # the request in flight recorded as interrupted, the summary last
        assert tap.returncode == 0, output
        assert [r.role for r in kept] == [Role.MEASURE, Role.MEASURE, Role.SESSION]
        assert kept[1].error == "interrupted (SIGTERM)" and kept[2].extra["interrupted"] == 1
    else:  # nothing after the last whole line: the request in flight is lost with the process, nothing else
        assert tap.returncode == -signal.SIGKILL and [r.role for r in kept] == [Role.MEASURE]
