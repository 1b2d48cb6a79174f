"""`reusebench log-filter` between a real llama-server and its journal: no prompt or output text gets through, and
every line the parser keys on does.

The server runs at verbosity 9, the worst a user can set: its debug lines dump each launched task, prompt included.
"""

from __future__ import annotations

import subprocess
import sys

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
