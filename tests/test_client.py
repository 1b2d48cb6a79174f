"""The client's streams on the real llama-server: a progress callback can end one once the count is known."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reusebench import tiny
from reusebench.llama.client import LlamaClient, StreamEnded
from reusebench.llama.process import ServerProcess

from conftest import default_llama_server

pytestmark = pytest.mark.e2e

@pytest.fixture(scope="module")
def client() -> Iterator[LlamaClient]:
    args = ["-m", str(tiny.model_path("llama")), "-c", "4096", "-np", "1", "-b", "512", "-ub", "512"]
    with ServerProcess(default_llama_server(), args) as server, LlamaClient(server.base_url, server.api_key) as client:
        yield client


def document(client: LlamaClient) -> list[int]:
    return client.tokenize(" ".join(tiny.WORDS[i % len(tiny.WORDS)] for i in range(2000)))


def test_a_progress_callback_that_returns_nothing_leaves_the_stream_alone(client: LlamaClient) -> None:
    tokens = document(client)
    seen: list[tuple[int, int, int]] = []
    done = client.complete(tokens, n_predict=2, on_progress=lambda *numbers: seen.append(numbers))
    # every event is of this prompt; the last says all of it was processed
    assert {total for _, _, total in seen} == {len(tokens)} and seen[-1][0] == len(tokens)
    assert done.prompt_n + done.cache_n == len(tokens)


def test_a_progress_callback_ends_the_stream_once_the_count_is_known(client: LlamaClient) -> None:
    """The server's first event, sent before its first batch, says what it will re-process: total - cached."""
    tokens = document(client)
    extended = tokens + tokens[:600]
    with pytest.raises(StreamEnded) as ended:
        client.complete(extended, n_predict=2, on_progress=lambda processed, cached, total: True)
    # no batch has run at the first event: what is processed is what the cache held
    assert ended.value.total == len(extended) and ended.value.processed == ended.value.cached
    after = client.complete(extended, n_predict=2)  # the ended task was dropped; the slot still serves
    assert after.prompt_n + after.cache_n == len(extended)
