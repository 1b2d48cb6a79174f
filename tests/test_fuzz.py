"""The reuse model held against the real server by differential fuzzing (``reusebench.fuzz``): a short fuzz of
every memory family with a fixed seed, every kept case, and the RAM cache's limits the fuzzer made us model.

The long form is `reusebench fuzz --cases 1000` (docs/fuzz.md); its findings are in docs/measured.md.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, seed, settings

from reusebench import cli, tiny
from reusebench.capability import build as capability_build
from reusebench.capability import state_bytes
from reusebench.fuzz import strategies
from reusebench.fuzz.case import FAMILIES, Case, Send
from reusebench.fuzz.differential import play
from reusebench.fuzz.search import search
from reusebench.llama import binaries
from reusebench.llama.server import Server
from reusebench.reuse import expectation
from reusebench.reuse.prompt_cache import PromptCache
from reusebench.reuse.server_state import CacheEntry, Held

CASES = Path(__file__).parent / "data" / "fuzz"
SHORT_FUZZ = 8  # cases per family: about 20 s each on two busy cores
SEED = 20261206


@pytest.fixture(scope="module")
def server_build() -> capability_build.Build:
    return capability_build.of(binaries.resolve_binary("default", source="tests"))


@pytest.mark.e2e
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_short_fuzz_finds_no_difference(server_build: capability_build.Build, family: str) -> None:
    found = search(family, server_build, cases=SHORT_FUZZ, seed_value=SEED)
    assert found.cases == SHORT_FUZZ and found.requests >= SHORT_FUZZ
    assert found.shrunk is None, f"{found.shrunk.case.describe()}\n{found.shrunk.difference.describe()}"


@pytest.mark.e2e
@pytest.mark.parametrize("path", sorted(CASES.glob("*.json")), ids=lambda p: p.stem)
def test_every_kept_case_plays_as_expected(server_build: capability_build.Build, path: Path) -> None:
    """Every request as the model predicts; a case kept for a server defect ("defect") still meets it, at its last
    request: once a build no longer does, this fails and the defect's entry goes."""
    outcome = play(Case.read(path), server_build)
    assert outcome.difference is None, outcome.difference.describe()
    assert outcome.defect == json.loads(path.read_text()).get("defect", "")
    assert len(outcome.steps) == sum(isinstance(s, Send) for s in outcome.case.steps)


@pytest.mark.e2e
def test_a_planted_rule_is_found_and_shrunk(server_build: capability_build.Build,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that predicts one token too many for prompts over 40 tokens: the first case that sends one differs,
    and it shrinks to a single request of 41 to 48 tokens (three blocks of 16, the last one cut)."""
    complete = expectation.ServerModel.complete

    def off_by_one(self: expectation.ServerModel, tokens, **kw):  # type: ignore[no-untyped-def]
        found = complete(self, tokens, **kw)
        return expectation.Expected(found.prompt_n + (len(tokens) > 40), found.cache_n, found.cause)

    monkeypatch.setattr(expectation.ServerModel, "complete", off_by_one)
    found = search("attention", server_build, cases=50, seed_value=SEED)
    assert found.shrunk is not None
    (step,) = found.shrunk.case.steps
    assert isinstance(step, Send) and 41 <= step.length <= 48
    assert found.shrunk.difference.measured + 1 == found.shrunk.difference.expected


@pytest.mark.e2e
@pytest.mark.parametrize(("model", "length", "window"), [("gemma3", 300, 128), ("arch-lfm2", 100, 32),
                                                          ("qwen35", 77, 0), ("llama", 50, 0)])
def test_state_bytes_equal_a_slot_files(server_build: capability_build.Build, model: str, length: int,
                                        window: int) -> None:
    """The bytes measured after 1 and 2 tokens, split by llama.cpp's format, give the state of a longer prompt
    exactly: a slot file holds 12 bytes of header, 4 per token, then the state without its own 8."""
    path = tiny.model_path(model)
    memory = server_build.memory(path)
    found = state_bytes.probe(server_build.binary, path, memory, {})
    assert found is not None
    with tempfile.TemporaryDirectory() as slots, Server.of(
            server_build.path, ["-m", str(path), "-c", "1024", "-np", "1", "--slot-save-path", slots],
            call_timeout_s=600) as server:
        server.client.complete([found.per_cell % 50 + 100 + i % 7 for i in range(length)], n_predict=1, n_probs=0)
        saved = server.client.slot_save(0, "state.bin")
    assert saved["n_saved"] == length
    # a window's cache writes only the cells its last position attends to: the last `window` of them
    expected = found.full(length, min(length, window) if window else 0, 1)
    assert saved["n_written"] - 12 - 4 * length + 8 == expected


def _entry(n_tokens: int, size: int, first: int) -> CacheEntry:
    return CacheEntry(Held(tuple(range(first, first + n_tokens))), (), size)


def test_the_ram_cache_keeps_its_size_limit() -> None:
    cache = PromptCache(limit_bytes=1000)
    same = lambda _e: True  # noqa: E731
    assert cache.alloc(_entry(10, 400, 0), same) and cache.alloc(_entry(10, 400, 100), same)
    assert not cache.alloc(_entry(10, 1001, 200), same)  # alone over the limit: skipped, and lost
    # 800 + 300 > 1000: the oldest (tokens from 0) goes to make room
    assert cache.alloc(_entry(10, 300, 300), same)
    assert [e.held.tokens[0] for e in cache] == [100, 300] and cache.bytes == 700


def test_the_ram_cache_keeps_its_token_limit() -> None:
    """--cache-ram -1: no size limit, but the context is the token limit (n_ctx 256 here)."""
    cache = PromptCache(limit_bytes=0, limit_tokens=256)
    same = lambda _e: True  # noqa: E731
    for first in (0, 1000, 2000):
        cache.alloc(_entry(100, 0, first), same)
        cache.update()
    assert [e.held.tokens[0] for e in cache] == [1000, 2000]  # 300 > 256 tokens: the oldest went
    # with a size limit the token limit is what the size holds at the cache's bytes per token, where that is more
    # than the context: 10,000 bytes at 30 a token hold 333 tokens, so 300 stay although the context is 256
    sized = PromptCache(limit_bytes=10_000, limit_tokens=256)
    for first in (0, 1000, 2000):
        sized.alloc(_entry(100, 3000, first), same)
        sized.update()
    assert len(sized) == 3 and sized.n_tokens == 300


@pytest.mark.e2e
def test_a_kept_case_file_plays_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = Case("hybrid-no-shift", {"ctx-size": 512, "cache-ram": 1}, (Send(((1, 16), (2, 16)), 2),
                                                                       Send(((1, 16), (2, 16)), 2)), 16)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case.to_json()))
    assert cli.main(["fuzz", "--case", str(path)]) == 0
    assert "2 requests as expected" in capsys.readouterr().out


@pytest.mark.e2e
def test_a_broken_case_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps({"family": "attention", "options": {}, "block_tokens": 16,
                                "steps": [{"send": [[1, 16]], "n_predict": 1}, {"rewind": 0}]}))
    assert cli.main(["fuzz", "--case", str(path)]) == 3
    assert f"{path}: step 2: expected send, save, restore or erase" in capsys.readouterr().err


@pytest.mark.e2e
def test_the_window_family_holds_on_the_real_gemma_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # what holds on the tiny window model holds on Gemma 3 270M (a 512-token window on five of six layers):
    # two generated cases, every count as the model predicts
    assert cli.main(["fuzz", "--family", "window", "--model", "real:gemma3-270m", "--cases", "2", "--seed", str(SEED),
                     "--results", str(tmp_path)]) == 0
    summary = json.loads(next(tmp_path.rglob("fuzz.json")).read_text())
    assert summary["model"] == "gemma-3-270m-q4_k_m.gguf"
    assert summary["families"][0]["generated"] == 2 and summary["families"][0]["difference"] is None
    assert "on gemma-3-270m-q4_k_m.gguf (counts only)" in " ".join(capsys.readouterr().err.split())


@pytest.mark.e2e
@pytest.mark.parametrize(("argv", "error"), [
    (["--model", "real:gemma3-270m"], "--model takes one --family"),
    (["--family", "window", "--model", "/no/such.gguf"], "argument --model: no model file '/no/such.gguf'"),
    (["--family", "window", "--model", "real:nemo"], "unknown real model 'nemo'"),
])
def test_a_model_in_place_of_the_tiny_one_is_checked_first(argv: list[str], error: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = cli.main(["fuzz", *argv])
    except SystemExit as usage:  # argparse's: the option's own value is wrong
        status = usage.code
    assert status == 2
    assert error in capsys.readouterr().err


@pytest.mark.e2e
def test_an_older_build_gets_only_the_options_its_help_lists() -> None:
    # b9093 (2026-05) has no --checkpoint-min-step: a launch for it never carries one, where the pinned build's do
    pinned = set(capability_build.of(binaries.resolve_binary("default", source="tests")).help)
    older = pinned - {"checkpoint-min-step"}
    assert "checkpoint-min-step" in _options_drawn(pinned)
    assert _options_drawn(older) <= older


def _options_drawn(listed: set[str]) -> set[str]:
    seen: set[str] = set()

    @seed(SEED)
    @settings(max_examples=200, database=None, deadline=None)
    @given(strategies.cases("hybrid", listed, slot_actions=False))
    def draw(case: Case) -> None:
        seen.update(case.options)

    draw()
    return seen
