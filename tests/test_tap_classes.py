"""The tap's reading of traffic without a server: classes from token ids, the perfect cache's ideal, the answer's
stream cut at any byte, the key kept out of the results, tasks paired across server restarts, and the warning
for a log without the lines the causes need."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reusebench.config import users
from reusebench.llama import task_log
from reusebench.records import Role, read_records
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.tap import Tap, TapOptions, exchange, keys
from reusebench.tap.conversations import Conversations

SYSTEM = list(range(1, 26))  # 25 tokens every conversation opens with


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_conversation_turn_by_turn() -> None:
    c = Conversations()
    first = SYSTEM + ids(1000, 200)
    t1 = c.classify(first, sleeps=0, now=0.0)
    assert (t1.classed.kind, t1.classed.user, t1.classed.turn, t1.classed.role) == ("first", "conv-1", 1, Role.MEASURE)
    assert t1.classed.ideal == 225  # nothing seen before
    c.ended(t1, ids(5000, 10), now=1.0)
    second = first + ids(5000, 10) + ids(2000, 16)  # the answer and a question
    t2 = c.classify(second, sleeps=0, now=2.0)
    # a perfect cache holds first + answer (235 tokens): the 16-token question is new
    assert (t2.classed.kind, t2.classed.turn, t2.classed.ideal, t2.classed.divergence) == ("continues", 2, 16, 235)
    assert t2.classed.gap_s == 1.0
    c.ended(t2, ids(6000, 10), now=3.0)
    again = c.classify(second, sleeps=0, now=4.0)
    assert (again.classed.kind, again.classed.turn, again.classed.ideal) == ("regenerate", 3, 1)


def test_a_failed_call_sent_again_is_a_retry_and_a_sleep_makes_the_next_turn_after_sleep() -> None:
    c = Conversations()
    prompt = SYSTEM + ids(1000, 100)
    c.ended(c.classify(prompt, sleeps=0, now=0.0), None, now=1.0)  # the call failed
    retry = c.classify(prompt, sleeps=0, now=2.0)
    assert retry.classed.kind == users.RETRY and retry.classed.ideal == 125  # nothing of it was computed
    c.ended(retry, ids(5000, 5), now=3.0)
    after = c.classify(prompt + ids(5000, 5) + ids(2000, 8), sleeps=1, now=4.0)
    assert after.classed.kind == users.AFTER_SLEEP and after.classed.ideal == 8


def test_a_long_idle_conversation_continues_after_a_gap() -> None:
    c = Conversations(gap_s=600.0)
    prompt = SYSTEM + ids(1000, 100)
    c.ended(c.classify(prompt, sleeps=0, now=0.0), ids(5000, 5), now=10.0)
    later = c.classify(prompt + ids(5000, 5) + ids(2000, 8), sleeps=0, now=700.0)
    assert later.classed.kind == users.AFTER_GAP and later.classed.gap_s == 690.0


def test_a_summary_at_the_head_is_a_head_insert_of_the_same_conversation() -> None:
    c = Conversations()
    other = c.classify(SYSTEM + ids(3000, 50), sleeps=0, now=0.0)
    c.ended(other, ids(7000, 5), now=0.5)
    prompt = SYSTEM + ids(1000, 100)
    t1 = c.classify(prompt, sleeps=0, now=1.0)
    c.ended(t1, ids(5000, 5), now=2.0)
    summary = ids(9000, 40)
    moved = SYSTEM + summary + prompt[25:] + ids(5000, 5) + ids(2000, 8)
    t2 = c.classify(moved, sleeps=0, now=3.0)
    assert (t2.classed.kind, t2.classed.user, t2.classed.turn, t2.classed.inserted) == ("head insert", "conv-2", 2, 40)
    assert t2.classed.ideal == len(moved) - 25  # only the system prompt is a prefix seen before


def test_an_edit_inside_the_history_and_a_short_unrelated_request() -> None:
    c = Conversations(probe_tokens=32)
    for n in (1, 2):
        c.ended(c.classify(SYSTEM + ids(1000 * n, 200), sleeps=0, now=0.0), ids(5000, 5), now=1.0)
    assert c.shared_opening() == 25
    edited = SYSTEM + ids(1000, 100) + [99999] + ids(1101, 99)
    t = c.classify(edited, sleeps=0, now=2.0)
    assert (t.classed.kind, t.classed.user, t.classed.ideal) == ("edit", "conv-1", 100)
    probe = SYSTEM[:20] + [77777]
    p1, p2 = c.classify(probe, sleeps=0, now=3.0), c.classify(probe, sleeps=0, now=4.0)
    assert (p1.classed.kind, p1.classed.role, p1.classed.turn, p2.classed.turn) == (users.UNRELATED, Role.PROBE, 1, 2)
    assert c.started == 2  # probes start no conversation


def test_the_perfect_cache_drops_what_a_newer_sequence_extends_and_stays_in_its_bound() -> None:
    seen = PerfectCache(max_tokens=300)
    seen.add(ids(0, 100))
    seen.add(ids(0, 150))  # extends the first: one entry of 150
    assert seen.tokens == 150 and seen.ideal(ids(0, 160)) == 10
    seen.add(ids(500, 200))  # over the bound: the oldest goes
    assert seen.tokens == 200 and seen.ideal(ids(0, 160)) == 160


def test_an_answer_stream_cut_at_every_byte_reads_the_same() -> None:
    chunks = [{"tokens": [5, 6], "content": "ab"}, {"prompt_progress": {"total": 9}},
              {"tokens": [7], "stop": True, "id_slot": 2, "timings": {"prompt_n": 3, "cache_n": 6}}]
    wire = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    for cut in range(1, len(wire)):
        answer = exchange.Answer(streamed=True)
        answer.feed(wire[:cut])
        answer.feed(wire[cut:])
        assert (answer.ids, answer.id_slot, answer.done, answer.timings["cache_n"]) == ([5, 6, 7], 2, True, 6)


def test_a_chat_answer_without_ids_keeps_no_text_and_its_next_turn_shows_its_ids() -> None:
    body = {"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}], "timings": {"predicted_n": 5}}
    answer = exchange.Answer(streamed=False)
    answer.feed(json.dumps(body).encode())
    answer.finish()
    assert answer.done and answer.generated and answer.ids == [] and "hello" not in repr(answer)
    c = Conversations()
    prompt = SYSTEM + ids(1000, 100)
    c.ended(c.classify(prompt, sleeps=0, now=0.0), None, answered_n=5, now=1.0)
    after = c.classify(prompt + ids(5000, 5) + ids(2000, 8), sleeps=0, now=2.0)
    # the 5 answer tokens come back right after the prompt: a perfect cache held them
    assert (after.classed.kind, after.classed.ideal) == ("continues", 8)


def test_the_key_is_made_private_and_refused_inside_the_results(tmp_path: Path) -> None:
    key = keys.load_key(tmp_path / "conf" / "tap.key", tmp_path / "results")
    assert len(key) == keys.KEY_BYTES and (tmp_path / "conf" / "tap.key").stat().st_mode & 0o777 == 0o600
    assert keys.load_key(tmp_path / "conf" / "tap.key", tmp_path / "results") == key
    with pytest.raises(keys.KeyFileError, match="inside the results directory"):
        keys.load_key(tmp_path / "results" / "tap.key", tmp_path / "results")
    a, b = keys.Hasher(key), keys.Hasher(b"another key of 32 bytes, really!")
    assert a.tokens([1, 2, 3]) == a.tokens([1, 2, 3]) != b.tokens([1, 2, 3])


def lifetime(port: int, n_tokens: int, slot_size: int) -> str:
    """One server's start and its task 0 on slot 0, as b11434 logs them at -lv 4."""
    return f"""\
0.00.100.000 I srv  llama_server: listening on http://127.0.0.1:{port}
0.01.000.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1
0.01.000.001 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.01.000.002 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = {n_tokens}
0.01.000.003 I slot      release: id  0 | task 0 | stop processing: n_tokens = {slot_size}, truncated = 0
"""


def test_tasks_are_paired_across_server_restarts_appended_or_started_anew(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(lifetime(8080, 40, 44))
    tasks = task_log.TaskLog(log)
    first = tasks.claim(None, 40, wait_s=0)
    with log.open("a") as f:  # restarted, appending (>>): task ids start again at 0
        f.write(lifetime(8080, 50, 54))
    second = tasks.claim(None, 50, wait_s=0)
    assert (first.task, first.lifetime, second.task, second.lifetime) == (0, 0, 0, 1)
    assert first.cause().n_tokens_after == 44 and second.cause().n_tokens_after == 54  # its own release
    log.write_text(lifetime(8080, 60, 64))  # restarted, writing anew (>): the file shrank
    third = tasks.claim(0, 60, wait_s=0)
    assert (third.task, third.lifetime, tasks.lifetimes) == (0, 2, 3)


def test_the_tap_warns_when_the_log_lacks_the_lines_its_causes_need(tmp_path: Path) -> None:
    def warnings_for(log: Path | None) -> list[str]:
        tap = Tap(TapOptions(upstream="http://127.0.0.1:9", listen=("127.0.0.1", 0), results=tmp_path / "results",
                             key_file=tmp_path / "tap.key", server_log=log))
        try:
            return tap.log_warnings()
        finally:
            tap.stop()
    assert "no --server-log" in warnings_for(None)[0]
    assert "no such file yet" in warnings_for(tmp_path / "missing.log")[0]
    info_only = tmp_path / "info.log"  # at the default verbosity the launch shows, the 'new prompt' line does not
    info_only.write_text("\n".join(line for line in lifetime(8080, 40, 44).splitlines() if "new prompt" not in line))
    assert "below -lv 4" in warnings_for(info_only)[0]
    full = tmp_path / "full.log"
    full.write_text(lifetime(8080, 40, 44))
    assert warnings_for(full) == []


def idle_tap(tmp_path: Path) -> Tap:
    """A tap before an upstream where nothing listens: its loop runs, nothing is relayed."""
    return Tap(TapOptions(upstream="http://127.0.0.1:9", listen=("127.0.0.1", 0), results=tmp_path / "results",
                          key_file=tmp_path / "tap.key", server_log=None))


def test_a_tap_runs_its_loop_once_and_writes_one_summary(tmp_path: Path) -> None:
    tap = idle_tap(tmp_path)
    tap.start()
    first = tap.stop("the test ended")
    assert tap.stop("again") is first  # the first reason stands, the summary is not written again
    with pytest.raises(RuntimeError, match="a tap runs once"):
        tap.run()
    with pytest.raises(RuntimeError, match="a tap runs once"):
        tap.start()
    summaries = [r for r in read_records(tap.run_dir.records_path) if r.role == Role.SESSION]
    assert len(summaries) == 1 and summaries[0].extra["stopped_by"] == "the test ended"


def test_a_tap_that_fails_to_start_says_so_to_its_caller_and_in_its_summary(tmp_path: Path) -> None:
    # its messages' stream is closed (a service whose stderr went away): the start fails where it says "relaying"
    out = open(tmp_path / "out.txt", "w")
    out.close()
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", listen=("127.0.0.1", 0), results=tmp_path / "results",
                         key_file=tmp_path / "tap.key", server_log=None), out=out)
    with pytest.raises(RuntimeError, match=r"^the tap did not start: failed: I/O operation on closed file"):
        tap.start()
    (summary,) = read_records(tap.run_dir.records_path)  # no request, the summary all the same
    assert summary.role == Role.SESSION and summary.extra["stopped_by"].startswith("failed: I/O operation")


def test_a_server_log_that_cannot_be_read_is_a_warning_not_a_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a fault this machine cannot produce for real (it runs as root: every file reads)
    log = tmp_path / "server.log"
    log.write_text("")
    opens = Path.open

    def unreadable(self: Path, *args: object, **kwargs: object) -> object:
        if self == log:
            raise PermissionError(13, "Permission denied")
        return opens(self, *args, **kwargs)  # type: ignore[call-overload]
    monkeypatch.setattr(Path, "open", unreadable)
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", listen=("127.0.0.1", 0), results=tmp_path / "results",
                         key_file=tmp_path / "tap.key", server_log=log))
    tap.start()
    summary = tap.stop("the test ended")
    assert summary.extra["log_warnings"] == [f"--server-log {log}: cannot be read (PermissionError); the causes need it"]


def test_the_summary_judges_the_log_by_what_the_tap_read_not_by_reading_it_again(tmp_path: Path) -> None:
    # a busy server's -lv 4 log grows by GBs (148 MB for tools/tap_load.py's 4,000 requests, which the summary once
    # read whole, for minutes and 1 GB): the summary asks the task log what it read, each line once. Planted: the
    # lines read as the request ended are blanked in place (same size), so a second reading would find no
    # llama-server line and warn
    log = tmp_path / "server.log"
    log.write_text(lifetime(8080, 40, 44))
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", listen=("127.0.0.1", 0), results=tmp_path / "results",
                         key_file=tmp_path / "tap.key", server_log=log))
    assert tap.tasks is not None and tap.tasks.claim(None, 40, wait_s=0) is not None
    log.write_bytes(b" " * (log.stat().st_size - 1) + b"\n")
    tap.start()
    assert tap.stop("the test ended").extra["log_warnings"] == []
