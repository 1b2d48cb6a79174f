"""A model's memory is what the llama-server that loads it reports at startup (capability.learned_memory), on every
memory family of the pinned build: the six tiny models, the real Gemma 3 270M, and tiny models of other
architectures written by llama.cpp's own test-llama-archs (tiny:arch-NAME), each run through report A at 2K."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from reusebench import real, tiny
from reusebench.capability import learned_memory
from reusebench.cli import main
from reusebench.config import profiles
from reusebench.llama import arch_source, sources
from reusebench.llama.binaries import Binary
from reusebench.records import Role
from reusebench.reuse.server_inputs import Memory, memory_of
from reusebench.run import runner
from reusebench.run.selection import Selection

from conftest import REPORT_A_SIZE, default_llama_server

pytestmark = pytest.mark.e2e
REPORT_A = ("first_load", "resend", "interleave", "reask", "edit_middle", "restore_disk")


def binary() -> Binary:
    return Binary(default_llama_server())


@pytest.mark.parametrize(("name", "memory"), [
    ("qwen35", Memory("hybrid", can_shift=False)),  # IMRoPE: rope type 40
    ("granitehybrid", Memory("hybrid", can_shift=True)),
    ("nemotron_h", Memory("hybrid", can_shift=True)),
    ("glm5-next", Memory("hybrid", can_shift=True)),
    ("llama", Memory("attention", can_shift=True)),
    ("gemma3", Memory("swa", can_shift=True, window=128, window_layers=5)),  # WWWWWA, a 128-token window
])
def test_each_tiny_model_s_memory_is_what_its_server_built(name: str, memory: Memory) -> None:
    assert memory_of(learned_memory.probe(binary(), tiny.model_path(name))) == memory


def test_the_real_gemma_s_memory_is_a_512_token_window_on_15_of_18_layers() -> None:
    built = learned_memory.probe(binary(), real.model_path("gemma3-270m"))
    # Gemma 3: every sixth layer global, so 18 layers keep 15 windowed; trained for 32K
    assert (built.arch, built.family, built.window, built.window_layers, built.window_type, built.n_ctx_train) == (
        "gemma3", "windowed attention", 512, 15, "standard", 32768)
    assert memory_of(built) == Memory("swa", can_shift=True, window=512, window_layers=15)


# One tiny model of each memory family, written by test-llama-archs: what the server reports for it.
FAMILIES = {
    "mamba2": ("recurrent", 0, "", True, ""),
    "lfm2moe": ("hybrid", 0, "", True, ""),  # short convolutions beside attention, no ssm keys of its own
    "jamba": ("hybrid", 0, "", True, ""),
    "bailingmoe3": ("hybrid", 0, "", False, ""),  # M-RoPE: rope type 8
    "gpt-oss": ("windowed attention", 32, "standard", True, ""),
    "llama4": ("windowed attention", 8192, "chunked", True, ""),  # the current 8,192-token chunk, by its source
    "lfm2": ("windowed hybrid", 32, "standard", True, ""),
    "dots3note": ("attention", 0, "", True,
                  "dots3note: its llama_kv_cache_dsa, llama_kv_cache_dsa_iswa caches are not modelled"),
}


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_model_of_each_memory_family_reads_as_its_server_built_it(arch: str) -> None:
    built = learned_memory.probe(binary(), tiny.model_path(f"arch-{arch}"))
    assert (built.family, built.window, built.window_type, built.can_shift, built.not_modelled) == FAMILIES[arch]


@pytest.mark.parametrize("arch", FAMILIES)
def test_report_a_on_each_memory_family_is_as_expected_or_named_not_modelled(arch: str, tmp_path: Path) -> None:
    profile = tmp_path / f"tiny-arch-{arch}.yaml"
    profile.write_text(f"description: {arch}\nextends: tiny-base\nmodel: tiny:arch-{arch}\n")
    result = runner.run_profile(profiles.load_profile(str(profile)), Selection(sizes=(REPORT_A_SIZE,),
                                scenario_ids=tuple(REPORT_A)), results_dir=tmp_path, out=io.StringIO())
    measured = [r for r in result.records if r.role == Role.MEASURE]
    assert result.failed_sessions == 0 and len(measured) == 8  # six scenarios, restore_disk has three steps
    assert not [r for r in measured if r.verdict in ("UNEXPECTED", "WRONG OUTPUT")]
    if FAMILIES[arch][4]:  # no prediction, and the reason on every step
        assert {(r.expected, r.verdict, r.extra.get("not_modelled")) for r in measured} == {
            (None, "NOT MODELLED", FAMILIES[arch][4])}
    else:  # every count exactly as the reuse model predicted it
        assert [r.prompt_n for r in measured] == [r.expected for r in measured]


def test_the_memory_is_kept_per_binary_and_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REUSEBENCH_CAPABILITY_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "llama.gguf"
    shutil.copy(tiny.model_path("llama"), model)
    first = learned_memory.of_model(binary(), model)
    starts = []
    monkeypatch.setattr(learned_memory, "probe", lambda b, m: starts.append(m) or first)
    assert learned_memory.of_model(binary(), model) == first and starts == []  # kept: no start
    model.touch()  # a file replaced in place has a new time: read again
    learned_memory.of_model(binary(), model)
    assert starts == [model]


def test_a_model_the_build_cannot_load_is_named_with_the_server_s_own_line(tmp_path: Path) -> None:
    # the same file with general.architecture "lxama" (a GGUF string: 8-byte length, then the bytes)
    data = tiny.model_path("llama").read_bytes().replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
                                                         b"\x05\x00\x00\x00\x00\x00\x00\x00lxama", 1)
    model = tmp_path / "lxama.gguf"
    model.write_bytes(data)
    with pytest.raises(learned_memory.ModelLoadError) as raised:
        learned_memory.probe(binary(), model)
    assert str(raised.value).startswith(f"{model}: llama-server cannot load it: ")
    assert "unknown model architecture: 'lxama'" in str(raised.value)


def test_the_shipped_window_types_are_the_pinned_source_s() -> None:
    tree = sources.fetch_pinned(lambda _message: None).tree
    assert arch_source.window_types(tree) == arch_source.WINDOW_TYPES
    assert arch_source.WINDOW_TYPES["llama4"] == "chunked" and arch_source.WINDOW_TYPES["gpt-oss"] == "standard"
    assert arch_source.cases_of(tree, "llm_arch_is_hybrid") == list(arch_source.HYBRID)
    assert arch_source.cases_of(tree, "llm_arch_is_recurrent") == list(arch_source.RECURRENT)


def test_inspect_says_what_the_suite_believes_about_the_real_model(capsys: pytest.CaptureFixture[str]) -> None:
    model = real.model_path("gemma3-270m")
    assert main(["inspect", str(model), "--size", "2K"]) == 0
    out = capsys.readouterr().out
    assert "architecture: gemma3 (18 layers, trained context 32,768)" in out
    assert "window: standard window of 512 tokens on 15 of 18 layers" in out
    assert "--cache-reuse: cannot: the window's cache is smaller than the context (it can with --swa-full)" in out
    # the run's own plan (real prose: a 2,048-token document and the question): the live state holds it all, one
    # token to compute; the re-ask returns to the checkpoint 4 + 512 before the end, after the chunk-removed step
    # left the slot to another prompt and the RAM cache brought the document back
    said = " ".join(out.split())
    assert "resend/same prompt 1 of 2,063" in said and "reask/new question 511 of 2,057" in said
    assert "launch (tiny-base / default, as `run` starts it): --batch-size 2048 --cache-ram 8192" in said
    # a size beyond the trained context is refused as `run` refuses it, exit 3, before any server starts
    assert main(["inspect", str(model), "--size", "2K", "--size", "64K"]) == 3
    assert "at 64K: its longest prompt and output take" in capsys.readouterr().err


def test_inspect_json_names_a_memory_the_model_does_not_follow(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tiny.model_path("arch-dots3note")), "--size", "2K", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["memory"]["not_modelled"] == FAMILIES["dots3note"][4]
    assert {step["expected"] for step in found["costs"]["2K"]} == {None}


def test_inspect_of_a_file_that_is_not_there_is_a_usage_error(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing.gguf")]) == 2
    assert f"{tmp_path / 'missing.gguf'} does not exist" in capsys.readouterr().err


def test_inspect_says_what_swa_full_would_win_on_a_windowed_hybrid(capsys: pytest.CaptureFixture[str]) -> None:
    # lfm2: the recurrent state decides; the window moves the server's threshold back by n_swa (32), so a resend
    # returns to the checkpoint 4 + 512 before the end; --swa-full takes the window out of the test: 4
    for extra, resend in (([], "516"), (["--profile", str(SWA_FULL_PROFILE)], "4")):
        assert main(["inspect", str(tiny.model_path("arch-lfm2")), "--size", "2K", *extra]) == 0
        assert f"resend/same prompt {resend} of 2,06" in " ".join(capsys.readouterr().out.split())


SWA_FULL_PROFILE = Path(__file__).parent / "data" / "tiny-base-swa-full.yaml"


@pytest.mark.e2e
def test_inspect_and_run_of_one_profile_agree_step_by_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The same plan: the same steps in the same order, and each step's count the same up to the words the plan
    # counts for tokens: the plan counts the question (16 words) and each chat turn in words, the run in the
    # tokenizer's tokens (20 for that question), so a count may differ from the prediction by no more than the
    # prompt's length does. Where the prompt has the same length, the count is exact.
    model = tiny.model_path("qwen35")
    assert main(["inspect", str(model), "--profile", str(NEWCOMER), "--size", "2K", "--json"]) == 0
    predicted = {step["step"]: step for step in json.loads(capsys.readouterr().out)["costs"]["2K"]}
    assert main(["run", "--profile", str(NEWCOMER), "--size", "2K", "--results", str(tmp_path), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)  # the measured steps
    assert [f"{r['scenario']}/{r['step']}" for r in measured] == list(predicted)
    for r in measured:
        said = predicted[f"{r['scenario']}/{r['step']}"]
        words = abs(r["prompt_tokens"] - said["prompt_tokens"])
        assert abs(r["prompt_n"] - said["expected"]) <= words, (r["step"], r["prompt_n"], said)
        assert r["prompt_n"] == r["expected"], r  # and the run's own expectation, from its real prompts, is exact


NEWCOMER = Path(__file__).parent / "data" / "newcomer-tiny.yaml"
