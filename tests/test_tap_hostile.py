"""The tap's reading of what clients and servers send, as an attacker would send it: nothing raises, no text is
kept, memory stays bounded. Property-based where the input space is open (hypothesis, derandomized: the same
examples on every run). (The relay itself under attack, on a real llama-server: tests/test_tap_safety.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reusebench import cli
from reusebench.cli import parser
from reusebench.cli import tap as tap_cli
from reusebench.llama import client
from reusebench.llama.task_log import TaskLog
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.tap import Tap, exchange, keys
from reusebench.tap.conversations import Conversations
from reusebench.tap.naming import redacted, route_name

FUZZ = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
                    max_leaves=30)
FIELDS = st.fixed_dictionaries({}, optional={"prompt": JSON, "messages": JSON, "lora": JSON, "stream": JSON,
                                             "n_predict": JSON})


@FUZZ
@given(st.sampled_from(sorted(exchange.RECORDED)), FIELDS | JSON)
def test_any_json_body_is_read_or_named_unreadable_and_never_raises(path: str, body: object) -> None:
    asked = exchange.read_asked(path, json.dumps(body).encode())
    assert isinstance(asked, (exchange.Asked, str))
    if isinstance(asked, exchange.Asked) and asked.lora is not None:
        assert all(set(a) == {"id", "scale"} for a in asked.lora)


@FUZZ
@given(st.sampled_from(sorted(exchange.RECORDED)), st.binary(max_size=200))
def test_any_bytes_are_read_or_named_unreadable(path: str, body: bytes) -> None:
    assert isinstance(exchange.read_asked(path, body), (exchange.Asked, str))


def test_the_bodies_that_dropped_requests_before_are_read_or_named() -> None:
    nested = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert exchange.read_asked("/completion", nested) == "the body nests too deep"
    assert exchange.read_asked("/completion", b'{"prompt": [1, 2, 4294967296]}') == "a token id out of range"
    # llama-server takes a LoRA without a scale as scale 0.0 (json_value(entry, "scale", 0.0f))
    asked = exchange.read_asked("/completion", b'{"prompt": "a b", "lora": [{"id": 0}]}')
    assert isinstance(asked, exchange.Asked) and asked.lora == [{"id": 0, "scale": 0.0}]
    assert exchange.read_asked("/completion", b'{"prompt": "a", "lora": [{"id": "x"}]}') == \
        "a lora the tap does not read"


@FUZZ
@given(st.lists(FIELDS | JSON, max_size=6), st.integers(min_value=1, max_value=40), st.booleans())
def test_any_answer_cut_anywhere_is_read_without_raising(chunks: list[object], cut: int, streamed: bool) -> None:
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) if streamed else json.dumps(
        chunks).encode()
    answer = exchange.Answer(streamed=streamed)
    for at in range(0, len(data), cut):
        answer.feed(data[at: at + cut])
    answer.finish()
    assert answer.error is None or answer.error.startswith(("server ", "the answer"))


@FUZZ
@given(st.text(min_size=1), st.text())
def test_a_server_error_is_kept_as_its_fixed_type_never_its_message(message: str, kind: str) -> None:
    answer = exchange.Answer(streamed=False)
    answer.feed(json.dumps({"error": {"code": 400, "message": message, "type": kind}}).encode())
    answer.finish()
    assert answer.error == f"server {kind if kind in client.ERROR_TYPES else 'error'}"


def test_an_answer_with_a_null_choice_goes_on_to_its_timings() -> None:
    answer = exchange.Answer(streamed=True)
    answer.feed(b'data: {"choices": [null]}\n\ndata: {"choices": [{"text": "x", "finish_reason": "stop"}], '
                b'"timings": {"prompt_n": 3, "cache_n": 0, "prompt_ms": 1.0, "predicted_n": 1, "predicted_ms": 1.0}}\n\n')
    assert answer.done and answer.generated and answer.timings["prompt_n"] == 3


def test_unrecorded_requests_are_counted_by_fixed_names_and_credentials_never_named() -> None:
    assert route_name("GET", "/health") == "GET /health" and route_name("GET", "/slots/3") == "GET /slots/ID"
    assert route_name("GET", "/a client's own words") == "GET other"
    assert route_name("BREW", "/health") == "other /health"
    assert redacted("http://user:hunter2@127.0.0.1:8080/v") == "http://***@127.0.0.1:8080/v"
    assert redacted("http://127.0.0.1:8080") == "http://127.0.0.1:8080"


def test_conversations_stay_within_their_tokens_oldest_first_and_drop_all_ids_when_idle() -> None:
    c = Conversations(max_tokens=1_000, forget_after_s=100.0)
    for n in range(5):  # five conversations of 300 tokens: 1,500 held would pass the bound
        c.ended(c.classify(list(range(n * 1000, n * 1000 + 300)), sleeps=0, now=float(n)), [7], now=float(n))
    c.classify(list(range(9000, 9010)), sleeps=0, now=5.0)  # a short one: the next call applies the bound
    assert c.dropped == 2 and c.seen.tokens > 0  # 3 x 300 + the short one fit under 1,000
    c.classify(list(range(20000, 20300)), sleeps=0, now=500.0)  # every earlier one idled out
    assert c.seen.tokens == 0  # their ids went with them


def test_the_perfect_cache_and_the_task_log_are_bounded(tmp_path: Path) -> None:
    cache = PerfectCache(max_tokens=100)
    for n in range(5):
        cache.add(list(range(n * 100, n * 100 + 40)))
    assert cache.tokens <= 100 and cache.dropped == 3
    log = tmp_path / "server.log"
    log.write_text("".join(  # 50 tasks on slot 0 as b11434 logs them at -lv 4, task t with t + 10 prompt tokens
        f"0.01.000.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1\n"
        f"0.01.000.001 I slot launch_slot_: id  0 | task {t} | processing task, is_child = 0\n"
        f"0.01.000.002 I slot update_slots: id  0 | task {t} | new prompt, n_ctx_slot = 4096, n_keep = 0, "
        f"task.n_tokens = {t + 10}\n"
        f"0.01.000.003 I slot      release: id  0 | task {t} | stop processing: n_tokens = {t + 12}, truncated = 0\n"
        for t in range(50)))
    tasks = TaskLog(log, max_tasks=20)
    assert tasks.claim(0, 59, wait_s=0) is not None  # the newest is held
    assert tasks.claim(0, 10, wait_s=0) is None and tasks.dropped == 30  # the oldest 30 were let go


def test_a_key_file_others_may_read_or_in_an_unwritable_place_is_refused_naming_it(tmp_path: Path) -> None:
    open_key = tmp_path / "open.key"
    open_key.write_bytes(b"k" * 32)
    open_key.chmod(0o644)
    with pytest.raises(keys.KeyFileError) as refused:
        keys.load_key(open_key, tmp_path / "results")
    assert str(refused.value) == f"--key-file {open_key}: mode 644: others may read it; chmod 600 it"
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")  # HOME's .config is a file: the key's directory cannot be made
    with pytest.raises(keys.KeyFileError, match=rf"^--key-file {blocked}/tap.key: cannot make or read it "):
        keys.load_key(blocked / "tap.key", tmp_path / "results")


def test_each_memory_cap_is_a_flag_that_reaches_what_it_bounds(tmp_path: Path) -> None:
    (tmp_path / "server.log").touch()
    args = parser.build_parser().parse_args([
        "tap", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--server-log", str(tmp_path / "server.log"),
        "--results", str(tmp_path / "results"), "--key-file", str(tmp_path / "tap.key"),
        "--max-held-tokens", "64K", "--max-ideal-tokens", "1000", "--max-tasks", "7"])
    tap = Tap(tap_cli.tap_options(args))
    try:
        assert tap.conversations.max_tokens == 65_536 and tap.conversations.seen.max_tokens == 1_000
        assert tap.tasks is not None and tap.tasks.max_tasks == 7
    finally:
        tap.stop("the test ended")


@pytest.mark.parametrize("flag, value", [("--max-tasks", "0"), ("--max-connections", "-1"), ("--max-body-mib", "x"),
                                         ("--read-timeout", "0"), ("--max-held-tokens", "0")])
def test_a_limit_that_would_refuse_everything_is_a_usage_error_naming_its_flag(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["tap", "--upstream", "http://127.0.0.1:9", flag, value])
    assert exit_.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err
