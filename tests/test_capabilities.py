"""The build's capabilities on the real pinned llama-server: what its probes show, where they are kept, and how the
reuse model follows them. A wrong probe result, planted in the cache, must turn exactly the steps it decides into
UNEXPECTED; probing again must bring the agreement back."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from reusebench import capability, cli
from reusebench.capability import PINNED_RULES, Capabilities, cache
from reusebench.config import profiles
from reusebench.llama.binaries import Binary
from reusebench.records import Role, read_records
from reusebench.run import runner
from reusebench.run.selection import Selection

from conftest import default_llama_server

SIZE = 2048


@pytest.fixture()
def capability_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "capabilities"
    monkeypatch.setenv(cache.CACHE_ENV, str(directory))
    return directory


def launcher(directory: Path, extra_args: str = "") -> Path:
    path = directory / "llama-server-launcher"
    path.write_text(f'#!/bin/sh\nexec "{default_llama_server()}" "$@" {extra_args}\n')
    path.chmod(0o755)
    return path


@pytest.mark.e2e
def test_the_pinned_build_probes_as_the_rules_the_model_was_written_from(capability_cache: Path) -> None:
    binary = Binary(default_llama_server())
    found = cache.of_binary(binary)
    assert found.how == "probed" and found.values() == PINNED_RULES
    # The restore: the re-ask shares the 161 document tokens, and nothing gives them back (prompt.clear()).
    assert "re-asked 177 tokens sharing 161: cache_n=0; output as without reuse" in found.evidence[
        "slot_file_checkpoints"]
    # The user-message probes return exactly to where the last user message starts.
    for name in ("completion_message_delimiters", "user_message_checkpoints"):
        at, cache_n = re.search(r"at token (\d+)\D.*: cache_n=(\d+)$", found.evidence[name]).groups()
        assert int(at) == int(cache_n) > 1
    assert found.evidence["ram_cache_keeps_lora"].endswith("then the first again with it: cache_n=0")  # report B
    kept = json.loads(cache.path_of(cache.Executable(binary.path).key()).read_text())
    assert kept["capabilities"]["slot_file_checkpoints"] is False
    assert cache.of_binary(binary).how == "probed (cached)"


@pytest.mark.e2e
def test_a_launcher_is_probed_as_the_executable_it_starts_not_with_its_flags(capability_cache: Path,
                                                                             tmp_path: Path) -> None:
    # The launcher turns checkpoints off, which would make every checkpoint probe read "no": the probes run the
    # executable itself, and the result is kept under its hash, not the script's.
    script = Binary(launcher(tmp_path, "--ctx-checkpoints 0"))
    assert cache.executable(script).path == default_llama_server()
    found = cache.of_binary(script)
    assert found.how == "probed" and found.values() == PINNED_RULES
    assert [p.stem for p in capability_cache.glob("*.json")] == [cache.Executable(default_llama_server()).key()]


@pytest.mark.e2e
def test_a_binary_that_cannot_be_probed_gets_the_pinned_rules_and_says_why(capability_cache: Path,
                                                                           tmp_path: Path) -> None:
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error: no such option' >&2\nexit 3\n")
    broken.chmod(0o755)
    found = cache.of_binary(Binary(broken))
    assert found.how.startswith("not probed: ") and "exit" in found.how.lower()
    assert all(getattr(found.rules, name) == rule for name, rule in PINNED_RULES.items())
    assert not list(capability_cache.glob("*.json"))  # nothing kept for a binary that did not run


def restore_steps(results: Path) -> dict[str, tuple[str, int, int | None, str]]:
    profile = profiles.load_profile("tiny-qwen35")
    chosen = Selection(("mmproj=off,cache-reuse=0",), (SIZE,), ("restore_disk",))
    result = runner.run_profile(profile, chosen, results_dir=results, out=io.StringIO())
    return {r.step: (r.verdict, r.prompt_n, r.expected, r.build) for r in result.records
            if r.role == Role.MEASURE and r.scenario == "restore_disk"}


@pytest.mark.e2e
def test_a_wrong_probe_result_makes_the_steps_it_decides_unexpected_and_probing_again_restores_agreement(
        capability_cache: Path, tmp_path: Path) -> None:
    binary = Binary(default_llama_server())
    key = cache.Executable(binary.path).key()
    # Planted: "slot files carry checkpoints", as b11549's would read. The model then expects the resend after the
    # restart to return to the checkpoint 4 tokens before the end, and the re-ask to the one 4 + 512 before it.
    cache.store(key, Capabilities(**{**PINNED_RULES, "slot_file_checkpoints": True}), binary.path)
    wrong = restore_steps(tmp_path / "wrong")
    assert {step: got[:3] for step, got in wrong.items()} == {
        "resend": ("UNEXPECTED", 2069, 4),  # 2,065 + 4: the whole prompt, as b11434 restores no checkpoint
        "reask": ("UNEXPECTED", 2068, 515),
        "extension": ("hit", 19, 19),  # a strict extension needs no checkpoint: no rule of the planted one
    }
    assert wrong["resend"][3].endswith("; rules probed: slot files carry checkpoints: yes")
    assert cache.of_binary(binary, again=True).how == "probed"
    right = restore_steps(tmp_path / "right")
    assert {step: got[:3] for step, got in right.items()} == {
        "resend": ("miss", 2069, 2069), "reask": ("miss", 2068, 2068), "extension": ("hit", 19, 19)}
    assert right["resend"][3].endswith("; rules probed: as b11434")


@pytest.mark.e2e
def test_a_workload_predicts_with_its_own_binary_s_rules_not_the_pinned_build_s(capability_cache: Path,
                                                                                 tmp_path: Path) -> None:
    # a build that differs (planted as report B's fix would read: RAM entries keep their LoRA): the serial
    # workload predicts every turn with its binary's rules, so the turns the real b11434 clears are UNEXPECTED
    binary = Binary(default_llama_server())
    cache.store(cache.Executable(binary.path).key(), Capabilities(**{**PINNED_RULES, "ram_cache_keeps_lora": True}),
                binary.path)
    assert cli.main(["workload", "service-small", "--results", str(tmp_path)]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    measured = [r for r in read_records(run_dir / "records.jsonl") if r.role == Role.MEASURE]
    assert all(r.build.endswith("rules probed: RAM cache entries keep their LoRA: yes") for r in measured)
    # b11434 restored each from RAM and cleared it for its LoRA, where the planted rule restores an entry of the
    # turn's own LoRA and keeps it: every such turn is UNEXPECTED (and others whose RAM entry the rule changes);
    # but a turn after the sleep, which freed the memory, re-reads everything by either rule
    cleared = [r for r in measured
               if r.cause["summary"] == "LoRA-change clear after restoring from RAM" and r.step != "after sleep"]
    assert cleared and all(r.verdict == "UNEXPECTED" and r.prompt_n > r.expected for r in cleared)


def test_check_shows_only_the_rules_its_launch_can_meet_and_quotes_a_shared_probe_once() -> None:
    # 14 rules: two about an mmproj, one each about LoRA and sleep; a launch with none of them reads 10 and one line
    # saying so
    probed = Capabilities(**PINNED_RULES, how="probed",  # type: ignore[arg-type]  # bool fields
                          evidence={"slot_file_checkpoints": "restore: 2069 re-processed",
                                    "restore_keeps_slot_checkpoints": "restore: 2069 re-processed"})
    plain = probed.lines(capability.features(mmproj=False, lora=False, sleeps=False))
    assert len(plain) == 10 + 1
    assert plain[-1] == ("this build: 4 rule(s) about an mmproj, LoRA adapters, sleep left out, which this launch "
                         "does not use (`reusebench probe` lists every rule)")
    assert not any("LoRA" in line or "mmproj loaded" in line or "sleeping" in line for line in plain[:-1])
    assert sum("(restore: 2069 re-processed)" in line for line in plain) == 1
    assert "(the same probe as above)" in plain[1]
    with_lora = probed.lines(capability.features(mmproj=False, lora=True, sleeps=False))
    assert any("RAM cache entries keep their LoRA" in line for line in with_lora) and len(with_lora) == 11 + 1
    assert len(probed.lines()) == 14  # `probe`: every rule
