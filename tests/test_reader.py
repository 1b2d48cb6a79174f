"""The one strict reader of profiles, workloads and corpora: where each field sits, and the errors it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from reusebench import reader
from reusebench.config import corpus


def test_a_field_is_found_by_line_and_column_or_by_the_field_around_it(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("seed: 1\nusers:\n  - name: chat\n    lora: {share: 2}\n")
    doc = reader.read(path, ValueError, "workload")
    assert doc.at("seed") == f"{path}:1:1"
    assert doc.at("users[0].lora.share") == f"{path}:4:12"  # "share" in the flow mapping on line 4
    assert doc.at("users[0].turns") == f"{path}:3:5"  # absent: the user's mapping, which starts at "name"
    assert doc.at("max_seconds") == f"{path}:1:1"  # absent at the top: the file's start


def test_yaml_1_2_booleans_and_no_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("flash-attn: on\nverify: true\n")
    assert reader.read(path, ValueError, "profile").data == {"flash-attn": "on", "verify": True}
    path.write_text("seed: 1\nseed: 2\n")
    with pytest.raises(ValueError, match=rf"^{path}:2:1: invalid YAML: duplicate key 'seed'"):
        reader.read(path, ValueError, "profile")


def test_a_corpus_error_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("source: words\nquestions: [\"What is it\", \"Where is it\"]\nedit: x\nsumary: y\n")
    with pytest.raises(corpus.CorpusError, match=rf"^{path}:4:1: sumary: unknown field \(did you mean 'summary'\?\)"):
        corpus.load_spec(path)


def test_expand_env_raises_the_readers_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REUSEBENCH_TEST_SET", "/models")
    monkeypatch.delenv("REUSEBENCH_TEST_UNSET", raising=False)
    assert reader.expand_env("${REUSEBENCH_TEST_SET}/m.gguf", source="p.yaml:3:1", field_name="model") == "/models/m.gguf"
    assert reader.expand_env("${REUSEBENCH_TEST_UNSET:-x}", source="p.yaml:3:1", field_name="model") == "x"
    with pytest.raises(corpus.CorpusError, match=r"^p\.yaml:3:1: model: environment variable REUSEBENCH_TEST_UNSET"):
        reader.expand_env("${REUSEBENCH_TEST_UNSET}", source="p.yaml:3:1", field_name="model", error=corpus.CorpusError)
