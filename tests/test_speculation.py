"""Speculative decoding on the tiny hybrid, on the real llama-server: the counts with n-gram speculation on are the
reuse model's, step for step, and the same as with it off; the drafts the server accepted are recorded.

b11434 streams a token's probabilities (and a chat's token ids) only for the first token of each accepted draft
(llama.cpp #27196), so a speculating launch's calls go unstreamed: the growth chat's answers fed back to the reuse
model, and the outputs compared, are then whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reusebench import cli
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
