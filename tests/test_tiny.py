"""Tests for the tiny random-weight model factory."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import gguf
import httpx
import pytest

from reusebench import tiny

from conftest import raw_server


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _every_file(cache: Path) -> list[Path]:
    return (
        [tiny.model_path(name, cache) for name in tiny.MODEL_NAMES]
        + [tiny.lora_path(name, cache) for name in tiny.MODEL_NAMES]
        + [tiny.mmproj_path("llama", cache)]
    )


def test_generation_is_byte_for_byte_reproducible(tmp_path: Path) -> None:
    first = _every_file(tmp_path / "a")
    second = _every_file(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second]
    assert [_sha256(p) for p in first] == [_sha256(p) for p in second]
    assert not list((tmp_path / "a").glob(".*")), "no partial files left behind"


def test_cached_file_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tiny.model_path("llama", tmp_path)

    def fail(name: str, recipe: tiny.Recipe) -> None:
        raise AssertionError("regenerated a cached model")

    monkeypatch.setitem(tiny._MODEL_BUILDERS, "llama", fail)
    assert tiny.model_path("llama", tmp_path) == path


def test_file_name_changes_with_factory_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = tiny.model_path("llama", tmp_path)
    monkeypatch.setattr(tiny, "FACTORY_VERSION", tiny.FACTORY_VERSION + 1)
    assert tiny.model_path("llama", tmp_path) != before


def test_default_cache_dir_honours_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REUSEBENCH_MODEL_CACHE", str(tmp_path))
    assert tiny.default_cache_dir() == tmp_path
    assert tiny.model_path("llama").parent == tmp_path


def test_unknown_names_and_specs_are_rejected(tmp_path: Path) -> None:
    for lookup in (tiny.model_path, tiny.lora_path, tiny.mmproj_path):
        with pytest.raises(ValueError, match="granitehybrid-longmem"):
            lookup("gpt5", tmp_path)
    assert tiny.is_tiny_spec("tiny:qwen35") and not tiny.is_tiny_spec("qwen35.gguf")


def test_words_are_distinct_plain_words() -> None:
    assert 180 <= len(tiny.WORDS) == len(set(tiny.WORDS))
    assert all(word.isascii() and word.isalpha() and word.islower() for word in tiny.WORDS)


def test_cli_prints_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tiny.main(["llama", "qwen35", "--dir", str(tmp_path), "--kind", "lora"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tiny.lora_path(name, tmp_path)) for name in ("llama", "qwen35")]


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    return {tensor.name: tuple(int(n) for n in tensor.shape) for tensor in gguf.GGUFReader(path).tensors}


def test_glm5_next_is_a_kda_and_sparse_mla_hybrid(cache_dir: Path) -> None:
    path = tiny.model_path("glm5-next", cache_dir)
    fields = gguf.GGUFReader(path).fields
    shapes = _tensor_shapes(path)
    assert fields["general.architecture"].contents() == "glm5-next"
    # zero kv heads is how the loader tells a recurrent KDA layer from an MLA layer
    kv_heads = fields["glm5-next.attention.head_count_kv"].contents()
    assert kv_heads == [0 if kind == "K" else 1 for kind in tiny.RECIPES["glm5-next"].layers]
    assert 0 in kv_heads and 1 in kv_heads
    for il, heads in enumerate(kv_heads):
        assert (f"blk.{il}.ssm_conv1d_q.weight" in shapes) == (heads == 0)
        assert (f"blk.{il}.attn_kv_a_mqa.weight" in shapes) == (heads == 1)
        assert (f"blk.{il}.indexer.attn_k.weight" in shapes) == (heads == 1)
    assert fields["glm5-next.rope.dimension_count"].contents() == 0  # the loader requires nope-only MLA
    assert fields["glm5-next.hyper_connection.count"].contents() == 4  # the only count the loader supports
    assert path.stat().st_size < 8 * 2**20


@pytest.mark.parametrize("name", tiny.MODEL_NAMES)
def test_lora_pairs_match_their_model_weights(name: str, cache_dir: Path) -> None:
    """The loader's check: lora_a takes the weight's input width, lora_b gives its output width."""
    model = _tensor_shapes(tiny.model_path(name, cache_dir))
    lora = _tensor_shapes(tiny.lora_path(name, cache_dir))
    targets = {key.rpartition(".lora_")[0] for key in lora}
    assert targets and len(lora) == 2 * len(targets)
    for target in targets:
        (n_in, rank), (rank_b, n_out) = lora[f"{target}.lora_a"], lora[f"{target}.lora_b"]
        assert model[target][:2] == (n_in, n_out) and rank == rank_b == tiny.LORA_RANK


def _complete(client: httpx.Client, prompt: str, **options: object) -> dict:
    response = client.post("/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0, **options})
    assert response.status_code == 200, response.text
    return response.json()


def _document(n_words: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(tiny.WORDS) for _ in range(n_words))


@pytest.mark.e2e
@pytest.mark.parametrize("name", tiny.MODEL_NAMES)
def test_model_loads_completes_and_takes_lora(name: str, cache_dir: Path) -> None:
    lora = tiny.lora_path(name, cache_dir)
    with raw_server(tiny.model_path(name, cache_dir), "--lora", str(lora)) as (client, _log):
        assert _complete(client, _document(20))["tokens_predicted"] == 8
        assert [adapter["path"] for adapter in client.get("/lora-adapters").json()] == [str(lora)]


@pytest.mark.e2e
def test_glm5_next_lora_changes_the_output(cache_dir: Path) -> None:
    """glm5-next applies adapters only to its FFNs; one on its attention would load and do nothing."""
    lora = tiny.lora_path("glm5-next", cache_dir)
    with raw_server(tiny.model_path("glm5-next", cache_dir), "--lora", str(lora)) as (client, _log):
        applied = _complete(client, _document(20), lora=[{"id": 0, "scale": 1.0}])
        without = _complete(client, _document(20), lora=[{"id": 0, "scale": 0.0}])
    assert applied["content"] != without["content"]


@pytest.mark.e2e
def test_document_of_n_words_is_n_tokens_plus_bos(cache_dir: Path) -> None:
    with raw_server(tiny.model_path("llama", cache_dir)) as (client, _log):
        for n_words in (1, 50, 700):
            body = {"content": _document(n_words, seed=n_words), "add_special": True}
            tokens = client.post("/tokenize", json=body).json()["tokens"]
            assert len(tokens) == n_words + 1
            assert tokens[0] == tiny.BOS_ID
        chat = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "the river"}], "max_tokens": 4, "temperature": 0},
        )
        assert chat.status_code == 200, chat.text


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "resend_prompt_n"), [("granitehybrid", 4), ("glm5-next", 4), ("llama", 1)])
def test_identical_resend_reprocesses_as_documented(
    name: str, resend_prompt_n: int, cache_dir: Path
) -> None:
    prompt = _document(700)
    with raw_server(tiny.model_path(name, cache_dir)) as (client, _log):
        first = _complete(client, prompt)
        resend = _complete(client, prompt)
    assert first["timings"]["prompt_n"] == 701
    assert resend["timings"]["prompt_n"] == resend_prompt_n
    assert resend["content"] == first["content"]


@pytest.mark.e2e
def test_qwen35_disables_cache_reuse(cache_dir: Path) -> None:
    model = tiny.model_path("qwen35", cache_dir)
    with raw_server(model, "--cache-reuse", "256") as (_client, log):
        assert "cache_reuse is not supported by this context" in log.read_text()
    with raw_server(model, "--cache-reuse", "256", "--mmproj", str(tiny.mmproj_path("qwen35", cache_dir))) as (_client, log):
        assert "cache_reuse is not supported by multimodal" in log.read_text()


@pytest.mark.e2e
def test_long_memory_model_exposes_wrong_cache_reuse(cache_dir: Path) -> None:
    """Gotcha 1: --cache-reuse on a hybrid restores a stale recurrent state."""
    words = _document(700).split()
    edited = " ".join(words[:140] + words[170:])
    model = tiny.model_path("granitehybrid-longmem", cache_dir)
    with raw_server(model, "--cache-reuse", "256", "--cache-ram", "0") as (client, _log):
        _complete(client, " ".join(words))
        reused = _complete(client, edited, n_predict=16)
        cold = _complete(client, edited, n_predict=16, cache_prompt=False)
    assert reused["timings"]["cache_n"] > 600
    assert reused["content"] != cold["content"]
