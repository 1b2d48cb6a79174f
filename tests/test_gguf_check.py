from __future__ import annotations

import pytest

from reusebench import tiny
from reusebench.llama.gguf_check import GgufError, check_gguf


def test_generated_models_pass():
    for name in ("llama", "qwen35"):
        check_gguf(tiny.model_path(name))
    check_gguf(tiny.lora_path("qwen35"))
    check_gguf(tiny.mmproj_path("qwen35"))


@pytest.mark.parametrize("keep", [100, 100_000, -1000])
def test_truncated_file_names_the_file(tmp_path, keep):
    broken = tmp_path / "model.gguf"
    broken.write_bytes(tiny.model_path("llama").read_bytes()[:keep])
    with pytest.raises(GgufError, match=f"{broken}: .*(truncated|corrupt)"):
        check_gguf(broken)


def test_not_gguf(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("this is not a model\n" * 100)
    with pytest.raises(GgufError, match="not a readable GGUF file"):
        check_gguf(text)
