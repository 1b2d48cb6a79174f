"""Speculative decoding on the tiny hybrid, on the real llama-server: the counts with n-gram speculation, a draft
model or an MTP head on are the reuse model's, step for step, and the same as with it off; the drafts the server
accepted, and those it undid (in place or from a speculative checkpoint), are recorded.

b11434 streams a token's probabilities (and a chat's token ids) only for the first token of each accepted draft
(llama.cpp #27196), so a speculating launch's calls go unstreamed: the growth chat's answers fed back to the reuse
model, and the outputs compared, are then whole."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from reusebench import cli, records
from reusebench.records import Role, StepVerdict, read_records

pytestmark = pytest.mark.e2e

PROFILE = Path(__file__).parent / "data" / "tiny-qwen35-spec.yaml"


def test_n_gram_speculation_re_processes_what_the_model_expects_and_what_no_speculation_does(tmp_path: Path) -> None:
    assert cli.main(["run", "--profile", str(PROFILE), "--size", "2K", "--scenario", "resend", "--scenario", "reask",
                     "--scenario", "growth", "--scenario", "restore_disk", "--results", str(tmp_path)]) == 0
    measured = [r for r in read_records(next(tmp_path.glob("runs/*/records.jsonl"))) if r.role == Role.MEASURE]
    by_variant = {v: [r for r in measured if r.variant == v] for v in ("spec-type=none", "spec-type=ngram-mod")}
    on = by_variant["spec-type=ngram-mod"]
    assert len(on) == 10 and all(r.prompt_n == r.expected for r in on), [(r.step, r.prompt_n, r.expected) for r in on]
    # the same counts with speculation off (growth turn 2: 1 + the 40-token question; the restore: everything)
    assert [r.prompt_n for r in on] == [r.prompt_n for r in by_variant["spec-type=none"]]
    assert not any(r.verdict == StepVerdict.WRONG_OUTPUT for r in on)
    # greedy: each step's answer token for token as without speculation (the outputs' hashes, keyed by the run)
    assert [r.output_hash for r in on] == [r.output_hash for r in by_variant["spec-type=none"]]
    # a conversation that repeats its answers gets drafts accepted; the off launch drafts nothing
    assert sum(r.extra.get("draft_accepted", 0) for r in on if r.scenario == "growth") > 0
    assert not any("draft_n" in r.extra for r in by_variant["spec-type=none"])
    # a speculating step that drafted nothing says 0 (b11434's timings leave draft_n out), not n/a
    assert all("draft_n" in r.extra for r in on) and any(r.extra["draft_n"] == 0 for r in on)
    assert all(r.ttft_ms is None for r in on)  # unstreamed: no first token seen apart from the whole answer
    assert all(r.prompt_ms is not None for r in on)  # and no step stopped at its count: nothing streams progress


def test_check_says_whether_the_server_drafts_and_how_it_undoes_a_rejected_draft(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a passage, the model's answer to it and the passage again: the n-gram drafter drafts the answer's tokens; the
    # hybrid's recurrent state is not rolled back (n_rs_seq 0 on this CPU build), so a speculative checkpoint undoes
    # a rejected draft
    assert cli.main(["check", "--profile", str(PROFILE), "--option", "spec-type", "--results", str(tmp_path),
                     "--json"]) == 0
    verdicts = {report["variant"]: report["verdicts"][0] for report in json.loads(capsys.readouterr().out)}
    off, on = verdicts["spec-type=none"], verdicts["spec-type=ngram-mod"]
    assert (off["verdict"], off["evidence"]) == ("ACTIVE", ["speculation off, as set"])
    assert on["verdict"] == "ACTIVE"
    accepted = int(re.search(r"accepted (\d+)", on["evidence"][0]).group(1))  # type: ignore[union-attr]
    assert accepted > 0
    assert on["evidence"][1] == "log: n_rs_seq = 0: a rejected draft is undone from a speculative checkpoint"
    # greedy: the answer is the one the server restarted without speculation gives
    assert "against the server without it (--spec-type none): identical" in on["evidence"][2]


def test_a_hybrid_without_rollback_says_it_falls_back_to_speculative_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # granitehybrid is not on llm_arch_supports_rs_rollback's list: its recurrent state cannot roll back a draft
    profile = tmp_path / "granite-spec.yaml"
    profile.write_text("extends: tiny-base\nmodel: tiny:granitehybrid\nn_predict: 32\noptions:\n"
                       "  spec-type: ngram-mod\n")
    assert cli.main(["check", "--profile", str(profile), "--option", "spec-type", "--results", str(tmp_path),
                     "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    (verdict,) = report["verdicts"]
    assert verdict["verdict"] == "ACTIVE"
    assert verdict["evidence"][1] == "log: n_rs_seq = 0: a rejected draft is undone from a speculative checkpoint"
    assert "(--spec-type none): identical" in verdict["evidence"][2]


DRAFT_PROFILE = Path(__file__).parent / "data" / "tiny-qwen35-draft.yaml"


def test_a_draft_model_whose_drafts_are_rejected_changes_no_count_and_no_answer(tmp_path: Path) -> None:
    # tiny:llama drafts for tiny:qwen35 (one vocabulary, unrelated random weights): nearly every draft is rejected,
    # so the hybrid's state is undone after nearly every draft, and still each answer is the one without speculation
    assert cli.main(["run", "--profile", str(DRAFT_PROFILE), "--size", "2K", "--scenario", "resend", "--scenario",
                     "reask", "--scenario", "growth", "--results", str(tmp_path)]) == 0
    measured = [r for r in read_records(next(tmp_path.glob("runs/*/records.jsonl"))) if r.role == Role.MEASURE]
    off, on = ([r for r in measured if r.variant == f"spec-type={kind}"] for kind in ("none", "draft-simple"))
    assert len(on) == 7 and [r.prompt_n for r in on] == [r.expected for r in on] == [r.prompt_n for r in off]
    assert [r.output_hash for r in on] == [r.output_hash for r in off]
    drafted = sum(r.extra["draft_n"] for r in on)
    assert drafted > 0 and sum(r.extra["draft_accepted"] for r in on) < drafted
    # qwen35 rolls back in place only for the kinds that ask for it (draft-mtp, eagle3, dflash, dspark:
    # common.h need_n_rs_seq), so every draft with a rejected token is undone from a speculative checkpoint (the log)
    rolled_back = [records.drafts_rolled_back(r) for r in on]
    assert all(rolled_back) and rolled_back == [r.cause["spec_checkpoints_restored"] for r in on]


def test_a_speculative_checkpoint_does_not_take_the_place_of_the_prompt_s_one(tmp_path: Path) -> None:
    # --ctx-checkpoints 1: the prompt keeps one checkpoint, 4 tokens before its end. The speculative checkpoint is the
    # slot's own (server-context.cpp:266, spec_ckpt), apart from that list, so after an answer whose every rejected
    # draft was undone from it, the resend still returns to the prompt's checkpoint: 4 tokens
    profile = tmp_path / "one-checkpoint.yaml"
    profile.write_text(f"extends: {DRAFT_PROFILE}\noptions:\n  ctx-checkpoints: 1\n")
    assert cli.main(["run", "--profile", str(profile), "--variant", "spec-type=draft-simple", "--size", "2K",
                     "--scenario", "resend", "--no-verify", "--results", str(tmp_path)]) == 0
    cold, resend = [r for r in read_records(next(tmp_path.glob("runs/*/records.jsonl"))) if r.role == Role.MEASURE]
    assert cold.cause["spec_checkpoints_restored"] > 0
    assert (resend.prompt_n, resend.expected) == (4, 4)


def test_after_a_restore_from_disk_the_draft_model_s_stale_context_fails_the_next_extension(tmp_path: Path) -> None:
    # b11434 saves and restores only the target's context (llama.cpp #28619): after the re-ask (2,068 + 31 tokens in
    # the draft's context, positions 0 to 2,098) the file's 2,100 tokens come back to the target alone, and the strict
    # extension's draft batch starts at position 2,100: "inconsistent sequence positions", HTTP 500
    assert cli.main(["run", "--profile", str(DRAFT_PROFILE), "--variant", "spec-type=draft-simple", "--size", "2K",
                     "--scenario", "restore_disk", "--results", str(tmp_path)]) == 1
    written = read_records(next(tmp_path.glob("runs/*/records.jsonl")))
    measured = {r.step: r for r in written if r.role == Role.MEASURE and r.scenario == "restore_disk"}
    assert (measured["resend"].prompt_n, measured["reask"].prompt_n) == (2069, 2068)  # as the model expects
    # the record keeps the status and llama-server's error type, never its message (which may quote the request)
    assert measured["extension"].error == "POST /completion: HTTP 500 (server_error)"
    (summary,) = [r for r in written if r.role == Role.SESSION]
    assert summary.extra["failures"] == ["restore_disk: ClientError: POST /completion: HTTP 500 (server_error)"]
    # the reuse model knows it cannot predict that step, and says why instead of a count
    extension = measured["extension"]
    assert extension.expected is None and "#28619" in extension.extra["not_modelled"]
    assert measured["resend"].expected == 2069  # re-processed from the start: both contexts agree


def test_check_calls_a_draft_model_whose_drafts_are_never_accepted_ineffective(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--profile", str(DRAFT_PROFILE), "--variant", "spec-type=draft-simple", "--option",
                     "spec-type", "--results", str(tmp_path), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    (verdict,) = report["verdicts"]
    assert verdict["verdict"] == "INEFFECTIVE"
    assert ", accepted 0" in verdict["evidence"][0] and verdict["evidence"][-1].startswith("no draft was accepted")
    assert "(--spec-type none): identical" in verdict["evidence"][2]  # rejected drafts leave the answer as it was


MTP = ["--profile", "tiny-qwen35-speculation", "--variant", "spec-type=none", "--variant", "spec-type=draft-mtp"]


def test_mtp_drafts_roll_the_hybrid_s_state_back_in_place_and_change_no_count_and_no_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tiny:qwen35-mtp drafts 3 tokens at a time with its NextN block, and b11434 sizes the Gated DeltaNet state to roll
    # back 3 (n_rs_seq = --spec-draft-n-max), so a draft with a rejected token is cut back in place: no speculative
    # checkpoint is restored. Some drafts are accepted, most are not; each answer is the one without speculation.
    assert cli.main(["run", *MTP, "--size", "2K", "--scenario", "resend", "--scenario", "reask", "--scenario", "growth",
                     "--scenario", "restore_disk", "--results", str(tmp_path)]) == 0
    measured = [r for r in read_records(next(tmp_path.glob("runs/*/records.jsonl"))) if r.role == Role.MEASURE]
    off, on = ([r for r in measured if r.variant == f"spec-type={kind}"] for kind in ("none", "draft-mtp"))
    assert len(on) == 10 and [r.prompt_n for r in on] == [r.expected for r in on] == [r.prompt_n for r in off]
    assert [r.output_hash for r in on] == [r.output_hash for r in off]
    for r in on:
        drafts, rolled_back = r.cause["drafts"], records.drafts_rolled_back(r)
        assert 0 < r.extra["draft_accepted"] < r.extra["draft_n"] <= 3 * drafts, (r.step, r.extra, r.cause)
        assert rolled_back and r.cause["spec_checkpoints_restored"] == 0, (r.step, r.cause)
    # unlike a draft model's context (test above), the MTP context takes the restored slot's extension
    assert {r.step: r.prompt_n for r in on if r.scenario == "restore_disk"}["extension"] == 19
    assert cli.main(["report", "--results", str(tmp_path)]) == 0
    assert "speculation at 2K" in capsys.readouterr().out
    # asv tracks each step's rolled-back drafts, and none where the launch does not speculate
    from benchmarks import common

    figures = common.summarise(measured, ["records.jsonl"])["figures"]
    resend = next(r for r in on if r.scenario == "resend")
    assert figures[("spec-type=draft-mtp", "2K", "resend/same prompt")]["rolled_back_drafts"] == \
        records.drafts_rolled_back(resend)
    assert math.isnan(figures[("spec-type=none", "2K", "resend/same prompt")]["rolled_back_drafts"])


def test_check_says_mtp_rolls_the_recurrent_state_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--profile", "tiny-qwen35-speculation", "--variant", "spec-type=draft-mtp", "--option",
                     "spec-type", "--results", str(tmp_path), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    (verdict,) = report["verdicts"]
    assert verdict["verdict"] == "ACTIVE"
    assert verdict["evidence"][1] == "log: n_rs_seq = 3: the recurrent state rolls back up to 3 tokens"
    assert "(--spec-type none): identical" in verdict["evidence"][2]


def test_on_real_weights_n_gram_drafts_are_accepted_and_change_no_count_and_no_answer(tmp_path: Path) -> None:
    # Gemma 3 270M (real weights, a sliding window): a conversation's earlier answers are what the n-gram kind drafts
    # from, and a real model repeats itself where random weights do not; the counts and each answer are as without
    # speculation, and every step is as the reuse model expects
    profile = tmp_path / "gemma-spec.yaml"
    profile.write_text("extends: gemma3-270m\nn_predict: 32\nmatrix:\n  spec-type: [none, ngram-mod]\n")
    # the answers compared by their hashes, so no reference without reuse is needed (--no-verify)
    assert cli.main(["run", "--profile", str(profile), "--size", "1K", "--scenario", "growth", "--no-verify",
                     "--results", str(tmp_path)]) == 0
    measured = [r for r in read_records(next(tmp_path.glob("runs/*/records.jsonl"))) if r.role == Role.MEASURE]
    off, on = ([r for r in measured if r.variant == f"spec-type={kind}"] for kind in ("none", "ngram-mod"))
    assert len(on) == 5 and [r.prompt_n for r in on] == [r.expected for r in on] == [r.prompt_n for r in off]
    assert [r.output_hash for r in on] == [r.output_hash for r in off]
    assert sum(r.extra["draft_accepted"] for r in on) > 0
