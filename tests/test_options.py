"""`reusebench check`: verdict plumbing without a server, then each verdict docs/check.md promises on the real
llama-server with generated tiny models (``e2e``; the whole file takes well under a minute on 2 cores)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from reusebench import check, cli
from reusebench.capability import build
from reusebench.check import OptionVerdict, Verdict
from reusebench.check.probes.launch import metrics_agreement
from reusebench.check.probes.reuse import probe_cache_prompt
from reusebench.check.run import CHECKED_DEFAULTS, PROBE_CTX_PER_SLOT, launch_args, settings_to_check
from reusebench.config import profiles
from reusebench.llama.client import Completion, TokenProbs
from reusebench.llama.process import ServerProcess

UNKNOWN_OPTIONS_PROFILE = """\
binary: default
model: tiny:granitehybrid
sizes: [2K]
options:
  mlock: true           # gone in b11434
  cache-reues: 256      # misspelled
  metrics: 5            # a bare flag given a value
  ctx-checkpoints: 8
"""


def completion(tokens: list[int], logprobs: list[float] | None = None, prompt_n: int = 10, cache_n: int = 0) -> Completion:
    probs = [TokenProbs(id=t, logprob=lp, top=()) for t, lp in zip(tokens, logprobs or [0.0] * len(tokens))]
    return Completion(prompt_n=prompt_n, cache_n=cache_n, prompt_ms=1.0, predicted_n=len(tokens), predicted_ms=1.0,
                      tokens_evaluated=prompt_n + cache_n, id_slot=0, ttft_ms=None, wall_ms=1.0, tokens=tokens,
                      probs=probs)


def by_key(verdicts: list[OptionVerdict]) -> dict[str, OptionVerdict]:
    return {verdict.key: verdict for verdict in verdicts}


def evidence(verdict: OptionVerdict) -> str:
    return "\n".join(verdict.evidence)


@pytest.fixture
def unknown_profile(tmp_path: Path) -> Path:
    path = tmp_path / "unknown.yaml"
    path.write_text(UNKNOWN_OPTIONS_PROFILE)
    return path


# --- no server ----------------------------------------------------------------------------------------


def test_verdict_codes_are_stable_and_cover_every_verdict() -> None:
    # asv keeps these numbers across commits: changing one rewrites history in the web UI
    assert {v.value: code for v, code in check.VERDICT_CODES.items()} == {
        "UNVERIFIED": 0, "ACTIVE": 1, "DISABLED": 2, "INEFFECTIVE": 3, "UNSAFE": 4, "UNSUPPORTED": 5,
    }


def test_option_verdict_dict_and_keys() -> None:
    plain = OptionVerdict("cache-reuse", "256", Verdict.UNSAFE, ("a", "b"))
    aspect = OptionVerdict("slot-save-path", "/tmp", Verdict.ACTIVE, (), aspect="strict extension after restart")
    assert plain.to_dict() == {"option": "cache-reuse", "aspect": None, "value": "256", "verdict": "UNSAFE",
                               "code": 4, "evidence": ["a", "b"]}
    assert json.loads(json.dumps(aspect.to_dict()))["verdict"] == "ACTIVE"
    worse = OptionVerdict("slot-save-path", "/tmp", Verdict.INEFFECTIVE, (), aspect="re-ask after restart")
    # one number per option: slot-save-path's aspects give ACTIVE (1) and INEFFECTIVE (3), the worse is tracked
    assert check.tracked_codes([plain, aspect, worse]) == {"cache-reuse": 4, "slot-save-path": 3}
    assert plain.key == "cache-reuse" and aspect.key == "slot-save-path[strict extension after restart]"


def test_metrics_agreement_compares_counter_deltas_with_summed_timings() -> None:
    before = {"llamacpp:prompt_tokens_total": 100.0, "llamacpp:prompt_tokens_cached_total": 0.0}
    after = {"llamacpp:prompt_tokens_total": 114.0, "llamacpp:prompt_tokens_cached_total": 96.0}
    done = [completion([1], prompt_n=10), completion([1], prompt_n=4, cache_n=96)]
    assert metrics_agreement(before, after, done).startswith("/metrics agrees")
    assert "DISAGREES" in metrics_agreement(before, after, done[:1])


def test_settings_cover_the_profile_and_the_reuse_defaults_in_probe_order() -> None:
    variant = profiles.load_profile("tiny-qwen35").variant("mmproj=on,cache-reuse=256")
    variant = replace(variant, options={**variant.options, "no-cache-prompt": True, "flash-attn": "off"})
    checked = settings_to_check(variant)
    names = [setting.option for setting, _ in checked]
    assert set(CHECKED_DEFAULTS) - {"cache-prompt"} <= set(names)
    assert names.index("parallel") == 0 and names.index("sleep-idle-seconds") == len(names) - 2  # sleeping ends it
    settings = {setting.option: (setting, probe) for setting, probe in checked}
    assert settings["no-cache-prompt"] == (check.Setting("no-cache-prompt", "true", False), probe_cache_prompt)
    assert settings["mmproj"][0].label.startswith("mmproj-")
    assert settings["cache-reuse"][0].value == 256
    assert settings["ctx-checkpoints"][0].label == "32"  # set by tiny-base
    assert settings["slot-save-path"][0].label == "default (disabled)"  # from --help
    assert settings["flash-attn"] == (check.Setting("flash-attn", "off", "off"), None)  # no probe: listed last


@pytest.mark.e2e
def test_launch_adds_a_probe_sized_context_and_metrics() -> None:
    variant = profiles.load_profile("tiny-granitehybrid").variants[0]
    args, added = launch_args(variant, build.of(variant.binary))
    assert added == ["--ctx-size", str(PROBE_CTX_PER_SLOT)]  # tiny-base: 1 slot, --metrics already set
    auto = replace(variant, options={"threads": 2})
    assert launch_args(auto, build.of(auto.binary))[1] == ["--ctx-size", str(4 * PROBE_CTX_PER_SLOT), "--metrics"]
    assert args[-2:] == added


@pytest.mark.e2e
def test_unknown_options_are_unsupported_before_any_launch(unknown_profile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server was started for a profile the binary rejects")

    monkeypatch.setattr(ServerProcess, "start", no_launch)
    variant = profiles.load_profile(unknown_profile, check_binary=False).variants[0]
    verdicts = by_key(check.check_variant(variant))
    assert {key for key, v in verdicts.items() if v.verdict is Verdict.UNSUPPORTED} == {
        "mlock", "cache-reues", "metrics"}
    assert "unknown llama-server option (llama.cpp b11434 dropped it; see --load-mode)" in evidence(verdicts["mlock"])
    assert "(did you mean 'cache-reuse'?)" in evidence(verdicts["cache-reues"])
    assert "--metrics is a bare flag; write true to pass it or false to leave it out, not 5" in evidence(
        verdicts["metrics"])
    assert verdicts["ctx-checkpoints"].verdict is Verdict.UNVERIFIED
    assert "not launched" in evidence(verdicts["cache-ram"])


@pytest.mark.e2e
def test_cli_check_json_exits_1_on_unsupported_and_keeps_its_verdicts_with_a_page(
        unknown_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--profile", str(unknown_profile), "--json", "--results", str(tmp_path)]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert report["variant"] == "default" and report["build"]
    assert {row["option"]: row["code"] for row in report["verdicts"]}["mlock"] == 5
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "check.json").read_text()) == [report]  # what the page and `view` are made from
    page = (run_dir / "index.html").read_text()
    assert "<tr class='' data-option='mlock'><td>mlock</td><td class='verdict-UNSUPPORTED'>" in page
    assert f'href="runs/{run_dir.name}/index.html"' in (tmp_path / "index.html").read_text()


def test_table_shows_option_value_verdict_and_every_evidence_line() -> None:
    table = check.render_table([OptionVerdict("cache-reuse", "256", Verdict.DISABLED, ("line one", "line two"),
                                                aspect="x")])
    for text in ("option", "evidence", "cache-reuse[x]", "DISABLED", "line one", "line two"):
        assert text in table


# --- the real llama-server ----------------------------------------------------------------------------


@functools.cache
def checked(profile: str, variant: str = "default") -> dict[str, OptionVerdict]:
    """One check per profile variant for the whole module (each costs a few seconds)."""
    return by_key(check.check_variant(profiles.load_profile(profile).variant(variant)))


@pytest.mark.e2e
def test_qwen35_cache_reuse_is_disabled_by_the_mmproj() -> None:
    verdict = checked("tiny-qwen35", "mmproj=on,cache-reuse=256")["cache-reuse"]
    assert verdict.verdict is Verdict.DISABLED
    assert "log [warn] cache_reuse is not supported by multimodal, it will be disabled" in verdict.evidence


@pytest.mark.e2e
def test_check_strict_exits_1_on_report_a_s_disabled_cache_reuse(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Report A's launch line: --cache-reuse 256 with the mmproj is DISABLED, and nothing is UNSAFE or UNSUPPORTED;
    so plain `check` exits 0 on it and `check --strict` exits 1, for a script or a nightly to act on."""
    argv = ["check", "--strict", "--profile", "tiny-qwen35", "--variant", "mmproj=on,cache-reuse=256", "--json",
            "--results", str(tmp_path)]
    assert cli.main(argv) == 1
    (found,) = json.loads(capsys.readouterr().out)
    verdicts = {v["option"]: v["verdict"] for v in found["verdicts"]}
    assert verdicts["cache-reuse"] == "DISABLED"
    assert not {v for v in verdicts.values() if v in check.FAILING_VERDICTS}  # without --strict: exit 0


@pytest.mark.e2e
def test_an_image_is_kept_on_a_resend_and_encoded_again_by_a_re_ask_whose_checkpoint_lies_before_it() -> None:
    # one image 16 tokens before the end of a prompt of ~800 tokens: the checkpoint 4 before the end lies after it,
    # the one 4 + 512 before the end before it, and none follows the image itself, so a re-ask goes back to that one
    verdicts = checked("tiny-qwen35", "mmproj=on,cache-reuse=256")
    resend, reask = verdicts["mmproj[image on a resend]"], verdicts["mmproj[image before a re-ask]"]
    assert resend.verdict is Verdict.ACTIVE
    assert "no image was encoded" in evidence(resend) and "prompt_n=4" in evidence(resend)
    assert "output: identical to the cache_prompt:false reference" in resend.evidence
    assert reask.verdict is Verdict.INEFFECTIVE
    assert "log [info] encoding mtmd batch from idx = " in evidence(reask)
    assert "prompt_n=516" in evidence(reask)  # back to the checkpoint 4 + 512 before the end


@pytest.mark.e2e
def test_qwen35_cache_reuse_is_disabled_by_the_context_without_mmproj() -> None:
    verdicts = checked("tiny-qwen35", "mmproj=off,cache-reuse=256")
    assert verdicts["cache-reuse"].verdict is Verdict.DISABLED
    assert "log [warn] cache_reuse is not supported by this context, it will be disabled" in verdicts[
        "cache-reuse"].evidence
    assert verdicts["mmproj"].verdict is Verdict.DISABLED  # /props modalities all false


@pytest.mark.e2e
def test_cache_reuse_on_a_long_memory_hybrid_is_unsafe_with_the_mismatch_shown() -> None:
    verdicts = checked("tiny-granitehybrid-longmem")
    reuse = verdicts["cache-reuse"]
    assert reuse.verdict is Verdict.UNSAFE
    assert "reusing chunk with size" in evidence(reuse) and "restored context checkpoint" in evidence(reuse)
    # its first token differs, far beyond the noise band measured at an odd ubatch near a quarter of it
    assert ("reused output against the cache_prompt:false reference: tokens differ from position 0; "
            in evidence(reuse)) and ("(the reference at ubatch 127), so WRONG" in evidence(reuse))
    # the reuse defaults around it work on this hybrid
    assert verdicts["cache-prompt"].verdict is Verdict.ACTIVE and "/metrics agrees" in evidence(verdicts["cache-prompt"])
    assert verdicts["ctx-checkpoints"].verdict is Verdict.ACTIVE
    assert verdicts["cache-ram"].verdict is Verdict.ACTIVE and "found better prompt" in evidence(verdicts["cache-ram"])
    assert verdicts["cache-idle-slots"].verdict is Verdict.INEFFECTIVE  # one slot: never an idle one to save
    assert verdicts["slot-prompt-similarity"].verdict is Verdict.ACTIVE
    assert verdicts["slot-save-path"].verdict is Verdict.DISABLED and "HTTP 501" in evidence(verdicts["slot-save-path"])


@pytest.mark.e2e
def test_slot_restore_on_a_hybrid_serves_only_a_strict_extension() -> None:
    verdicts = checked("check-slot-save")
    for aspect in ("resend after restart", "re-ask after restart"):
        verdict = verdicts[f"slot-save-path[{aspect}]"]
        assert verdict.verdict is Verdict.INEFFECTIVE
        assert "cache_n=0" in evidence(verdict) and "forcing full prompt re-processing" in evidence(verdict)
    assert verdicts["slot-save-path[strict extension after restart]"].verdict is Verdict.ACTIVE


@pytest.mark.e2e
def test_slot_restore_on_the_control_serves_everything() -> None:
    verdicts = checked("check-slot-save-llama")
    assert {key: v.verdict for key, v in verdicts.items() if key.startswith("slot-save-path")} == {
        f"slot-save-path[{aspect}]": Verdict.ACTIVE
        for aspect in ("resend after restart", "re-ask after restart", "strict extension after restart")}
    # pure attention needs no checkpoints
    assert verdicts["ctx-checkpoints"].verdict is Verdict.INEFFECTIVE


@pytest.mark.e2e
def test_sleep_is_active_and_the_caches_do_not_survive_it() -> None:
    verdict = checked("check-sleep")["sleep-idle-seconds"]
    assert verdict.verdict is Verdict.ACTIVE
    assert any(line.startswith("/props is_sleeping=true after") for line in verdict.evidence)
    assert "log [info] entering sleeping state" in verdict.evidence
    assert "finding: the caches did not survive sleep" in evidence(verdict)


@pytest.mark.e2e
def test_lora_init_without_apply_is_ineffective() -> None:
    verdicts = checked("check-lora-init")
    flag = verdicts["lora-init-without-apply"]
    assert flag.verdict is Verdict.INEFFECTIVE
    assert "GET /lora-adapters scales=[1.0]" in flag.evidence
    assert "output with no lora field equals output with scale 1" in flag.evidence
    assert verdicts["lora"].verdict is Verdict.ACTIVE  # the adapter does change the output


@pytest.mark.e2e
def test_cache_ram_0_turns_off_the_ram_cache_and_idle_slot_saving_with_four_auto_slots() -> None:
    verdicts = checked("check-cache-ram-off")
    assert verdicts["cache-ram"].verdict is Verdict.DISABLED
    assert "log [info] prompt cache is disabled - use `--cache-ram N` to enable it" in verdicts["cache-ram"].evidence
    assert verdicts["cache-idle-slots"].evidence == ("log [warn] --cache-idle-slots requires --cache-ram, disabling",)
    assert verdicts["cache-idle-slots"].verdict is Verdict.DISABLED
    parallel = verdicts["parallel"]
    assert parallel.verdict is Verdict.ACTIVE and parallel.value.startswith("default")
    assert "log [info] initializing, n_slots = 4, n_ctx_slot = 16384, kv_unified = 'true'" in parallel.evidence
    assert "/props total_slots=4" in parallel.evidence
    assert verdicts["kv-unified"].verdict is Verdict.ACTIVE


@pytest.mark.e2e
def test_control_with_four_auto_slots_and_features_switched_off(tmp_path: Path) -> None:
    """On pure attention cache-reuse works (a shifted chunk, the same output); four slots show idle-slot saving."""
    path = tmp_path / "small.yaml"
    path.write_text("binary: default\nmodel: tiny:llama\nsizes: [2K]\n"
                    "options: {threads: 2, cache-reuse: 256, slot-prompt-similarity: 0, no-cache-prompt: true}\n")
    verdicts = by_key(check.check_variant(profiles.load_profile(path).variants[0]))
    assert verdicts["cache-reuse"].verdict is Verdict.ACTIVE
    # the same output: identical, or within the band of the reference at an odd ubatch near a quarter of it
    said = verdicts["cache-reuse"].evidence[-1]
    assert said == "reused output identical to the cache_prompt:false reference" or said.endswith(
        "(the reference at ubatch 127), so within noise"), said
    assert verdicts["slot-prompt-similarity"].verdict is Verdict.DISABLED
    assert verdicts["no-cache-prompt"].verdict is Verdict.DISABLED
    assert verdicts["cache-idle-slots"].verdict is Verdict.ACTIVE
    assert verdicts["cache-ram"].verdict is Verdict.ACTIVE
    assert verdicts["threads"].verdict is Verdict.ACTIVE


@pytest.mark.e2e
def test_checkpoint_min_step_small_enough_to_probe(tmp_path: Path) -> None:
    path = tmp_path / "spacing.yaml"
    path.write_text(f"extends: {profiles.default_profiles_dir() / 'tiny-granitehybrid.yaml'}\n"
                    "options: {checkpoint-min-step: 256}\n")
    verdict = by_key(check.check_variant(profiles.load_profile(path).variants[0]))["checkpoint-min-step"]
    assert verdict.verdict is Verdict.ACTIVE
    assert "checkpoints at [1, 273," in evidence(verdict)
