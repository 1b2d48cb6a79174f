"""`reusebench log-filter` between a real llama-server and its journal: no prompt or output text gets through, and
every line the parser keys on does.

The server runs at verbosity 9, the worst a user can set: its debug lines dump each launched task, prompt included.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reusebench import tiny
from reusebench.llama import logs

from conftest import raw_server

MARKER = " ".join(tiny.WORDS[100:112])  # twelve words the prompt carries, in this order only


def events(lines: list[str]) -> list[tuple[object, ...]]:
    return [(e.kind, e.slot, e.task, tuple(sorted(e.fields.items()))) for e in logs.parse_lines(lines) if e.kind]


@pytest.mark.e2e
def test_the_filter_keeps_every_parsed_line_and_no_prompt_text() -> None:
    with raw_server(tiny.model_path("qwen35"), log_verbosity=9) as (client, log):
        for _ in range(2):  # the second request reuses the first: checkpoint and cache lines
            reply = client.post("/completion", json={"prompt": f"planted: {MARKER}. " * 20, "n_predict": 4})
            assert reply.status_code == 200
        raw = log.read_text()
    assert MARKER in raw  # the debug lines carry the prompt: what the filter is for
    done = subprocess.run([sys.executable, "-m", "reusebench", "log-filter"], input=raw, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    kept = done.stdout.splitlines()
    assert MARKER not in done.stdout and tiny.WORDS[105] not in done.stdout
    assert set(kept) <= set(raw.splitlines())  # lines pass unchanged or not at all
    parsed = events(raw.splitlines())
    assert len(parsed) > 10 and events(kept) == parsed  # the numbers the causes need, in order
    assert done.stderr.strip() == f"log-filter: kept {len(kept)} lines, dropped {len(raw.splitlines()) - len(kept)}"


HOSTILE = "zqxjv"  # one planted word, put where a field is in every kind of line the filter keeps


def kept_lines() -> list[str]:
    """Every distinct kind of line the filter keeps from the recorded b11434 logs (tests/data/logs), one of each."""
    one_each: dict[str, str] = {}
    for path in sorted((Path(__file__).parent / "data" / "logs").glob("*.log")):
        for line in path.read_text().splitlines():
            if logs.scrub_line(line) is not None:
                parsed = logs.parse_lines([line])
                one_each.setdefault(parsed[0].kind if parsed else line.split("=")[0], line)
    return list(one_each.values())


def test_a_hostile_word_in_any_field_of_any_kept_line_kind_is_dropped() -> None:
    """The word replaces each field of each kept line in turn, or stands beside it: no such line is kept. (A prompt
    at -lv 9 is logged inside the server's own lines, and b11434 never lets it form a line of its own (test_tap_safety),
but the filter does not rely on a build's escaping: a word of the prompt in a kept line's field is dropped.)"""
    lines = kept_lines()
    assert len(lines) >= 40  # the events and the startup lines the recorded logs hold
    tried = 0
    for line in lines:
        head, sep, message = line.partition(": ")
        words = message.split(" ")
        for i in range(len(words)):
            for planted in (HOSTILE, words[i] + HOSTILE, HOSTILE + words[i], f"{words[i]} {HOSTILE}"):
                hostile = head + sep + " ".join([*words[:i], planted, *words[i + 1:]])
                tried += 1
                assert logs.scrub_line(hostile) is None, hostile
    assert tried > 1000
    assert logs.scrub_line("0.00.050.000 I srv  load_model: loaded multimodal model, '/models/mmproj.gguf'") is None
