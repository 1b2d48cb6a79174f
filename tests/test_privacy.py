"""A marker sentence planted in a document never leaves the harness: not in a record, the report, the
summary, a kept server log, or the figures asv stores. The request that carries it is refused without the
run's API key.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from reusebench import cli, records, tiny
from reusebench.llama.client import ClientError, LlamaClient
from reusebench.llama.process import ServerProcess

from conftest import default_llama_server

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
# Twelve vocabulary words in an order the seeded filler lines do not produce: one token each in the tiny models.
MARKER = " ".join(tiny.WORDS[i] for i in (201, 57, 188, 143, 99, 176, 132, 66, 207, 121, 160, 83))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("privacy")
    rng = random.Random(11)
    lines = [" " + " ".join(rng.choice(tiny.WORDS) for _ in range(12)) for _ in range(400)]
    lines.insert(5, " " + MARKER)  # early: inside the first 1K tokens of the document
    (tmp / "doc.txt").write_text("\n".join(lines) + "\n")
    (tmp / "marked.yaml").write_text(
        "source: file\npath: doc.txt\n"
        f"questions: [' {tiny.WORDS[40]} {tiny.WORDS[41]} {tiny.WORDS[42]}', ' {tiny.WORDS[50]} {tiny.WORDS[51]}']\n"
        f"edit: ' {tiny.WORDS[60]} {tiny.WORDS[61]} {tiny.WORDS[62]}'\nsummary: ' {tiny.WORDS[70]} {tiny.WORDS[71]}'\n")
    # The hybrid with --cache-reuse: every scenario that applies, chat turns (the document in messages) included.
    code = cli.main(["run", "--profile", "tiny-granitehybrid-longmem", "--size", "1024", "--corpus",
                     str(tmp / "marked.yaml"), "--results", str(tmp / "results")])
    assert code == 0
    (found,) = (tmp / "results" / "runs").iterdir()
    return found


def test_the_marker_was_sent(run_dir: Path):
    kept = records.read_records(run_dir / "records.jsonl")
    cold = next(r for r in kept if r.scenario == "first_load")
    assert cold.prompt_tokens >= 1024 and MARKER.split()[0] in tiny.WORDS
    assert {r.endpoint for r in kept} >= {"/completion", "/v1/chat/completions"}


def test_the_marker_is_in_no_record_report_summary_page_log_or_asv_figure(run_dir: Path):
    files = [run_dir / "records.jsonl", run_dir / "report.md", run_dir / "summary.json", run_dir / "index.html",
             run_dir.parent.parent / "index.html", *sorted((run_dir / "logs").glob("*.log"))]
    assert len(files) == 6 and all(f.stat().st_size for f in files)
    half = " ".join(MARKER.split()[3:9])  # a fragment is a leak too
    for path in files:
        text = path.read_text()
        assert MARKER not in text and half not in text, path.name

    sys.path.insert(0, str(REPO))
    from benchmarks import common  # asv stores what summarise() returns, per track

    kept = records.read_records(run_dir / "records.jsonl")
    figures = common.summarise(kept, [str(run_dir / "records.jsonl")], failed_sessions=0)
    text = repr(figures)
    assert "prefill_seconds" in text and MARKER not in text and half not in text


def test_a_request_without_the_run_api_key_is_refused():
    with ServerProcess(default_llama_server(), ["-m", str(tiny.model_path("llama")), "-c", "512"]) as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        with LlamaClient(server.base_url) as anonymous, pytest.raises(ClientError) as refused:
            anonymous.complete(MARKER, n_predict=1)
        assert refused.value.status == 401
        with LlamaClient(server.base_url, "not-" + server.api_key) as wrong, pytest.raises(ClientError) as refused:
            wrong.tokenize(MARKER)
        assert refused.value.status == 401
