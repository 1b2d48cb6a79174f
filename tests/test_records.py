"""Records back into tables: the JSONL a run leaves is enough to rebuild its report, rates included."""

from __future__ import annotations

from pathlib import Path

import pytest

from reusebench.advise.next_steps import next_steps
from reusebench.config import profiles
from reusebench.llama.client import Completion
from reusebench.records import Record, RecordWriter, Role, lora_applied, lora_key, read_records, verdict
from reusebench.report import run_kinds, view
from reusebench.report import run_report as report
from reusebench.run import provenance
from reusebench.run.recording import Recorder, RunDir, Source


def record(scenario: str, step: str, *, role: str = "measure", prompt_tokens: int = 1000, cache_n: int = 0,
           ideal: int = 1, expected_hit: bool = True, **fields: object) -> Record:
    r = Record(run_id="r", session="p/v@1024", profile="p", variant="v", build="b1-test", model="tiny:x", size=1024,
               scenario=scenario, step=step, role=role, endpoint="/completion", started_at=0.0, ended_at=1.0,
               prompt_tokens=prompt_tokens, prompt_n=prompt_tokens - cache_n, cache_n=cache_n, ideal=ideal,
               excess=prompt_tokens - cache_n - ideal, prompt_ms=10.0, expected_hit=expected_hit,
               cause={"summary": "no reuse"})
    for name, value in fields.items():
        setattr(r, name, value)
    if role == Role.MEASURE:
        r.verdict = verdict(r)
    return r


RECORDS = [
    record("first_load", "cold", ideal=1000, expected_hit=False),
    record("resend", "same prompt", cache_n=996, matches_reference=True,
           extra={"output_check": "within noise", "output_delta": 1e-6, "noise_band": 4e-7}),
    record("edit_middle", "line at 50%", ideal=500),
    record("head_insert", "summary at the head", ideal=1000, expected_hit=False),
    record("lora_swap", "P with LoRA", role="setup", ideal=1000),
    record("lora_swap", "P + more, same LoRA", ideal=20),
    record("chunk_removed", "10% cut at 10%", cache_n=800, ideal=900, matches_reference=False,
           mismatch="token 0: id 5 != reference id 7", extra={"foreign_reused": 700}),
    record("resend", "same prompt", role="reference"),
]


def test_verdicts_separate_cannot_hit_turns_and_flag_wrong_output():
    assert [r.verdict for r in RECORDS if r.role == Role.MEASURE] == [
        "full (cannot hit)", "hit", "miss", "full (cannot hit)", "miss", "WRONG OUTPUT"]
    foreign = record("lora_swap", "P + more, no LoRA", cache_n=996, ideal=999, expected_hit=False,
                     matches_reference=True, extra={"foreign_reused": 995})
    assert foreign.verdict == "FOREIGN REUSE"


def test_miss_rates_count_turns_that_cannot_hit_apart():
    text = report.miss_rates(RECORDS)
    assert "miss rate of turns that should hit: 2 of 4 re-processed everything (50%)" in text
    assert "turns that cannot hit, counted apart: 2 (first_load/cold, head_insert/summary at the head)" in text
    assert "all turns in one denominator (misleading): 4 of 6 (67%)" in text
    assert "wrong output: 1; reused state computed for another prefix or LoRA: 1" in text


def test_jsonl_reads_back_into_the_same_tables(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        for r in RECORDS:
            writer.write(r)
    back = read_records(path)
    assert report.render_text(back) == report.render_text(RECORDS)
    text = report.render_text(back)
    assert "setup prefills (not measured): 1, 1,000 tokens re-processed (lora_swap/P with LoRA 1,000)" in text
    assert "reference prefills for correctness: 1" in text
    assert "same within noise (1e-06, band 4e-07)" in text
    assert "DIFFERS (token 0: id 5 != reference id 7); 700 tokens reused from another prefix or LoRA" in text


def test_a_step_the_reuse_model_did_not_expect_is_unexpected_and_the_report_shows_both_causes():
    agreed = record("reask", "new question", cache_n=485, ideal=17, expected=515, cause_expected="restored checkpoint")
    assert agreed.verdict == "partial"
    changed = record("reask", "new question", cache_n=0, ideal=17, expected=515,
                     cause_expected="restored checkpoint at n_tokens=485")
    changed.cause = {"summary": "forced full re-processing (no checkpoint before divergence)"}
    changed.verdict = verdict(changed)
    assert changed.verdict == "UNEXPECTED"
    wrong = record("reask", "new question", cache_n=0, expected=515, matches_reference=False)
    assert wrong.verdict == "WRONG OUTPUT"  # a wrong output outranks it
    text = report.render_text([record("first_load", "cold", ideal=1000, expected=1000, expected_hit=False), changed])
    assert "| reask      | new question | 1,000 / 17" in text and "| 515 (+485)" in text
    assert "forced full re-processing (no checkpoint before divergence) | restored checkpoint at n_tokens=485" in text
    assert "steps the reuse model did not expect: 1 (reask/new question)" in text


def test_one_lora_key_for_every_driver() -> None:
    assert lora_key(None) == "default"
    assert lora_key([{"id": 1, "scale": 0.5}, {"id": 0, "scale": 1.0}]) == "0:1,1:0.5"
    assert lora_key([{"id": 0, "scale": 0.0}]) == "0:0"
    assert [lora_applied(k) for k in ("default", "0:1", "0:0", "0:0,1:0.5")] == [True, True, False, True]


def test_version_1_records_read_with_the_lora_key_of_version_2(tmp_path: Path) -> None:
    """Scenario runs of schema 1 wrote the LoRA as JSON pairs; workloads wrote "id:scale" already."""
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as writer:
        for lora in ("[[0, 1.0]]", "[]", "0:0", "default"):
            writer.write(record("lora_swap", lora, lora=lora, schema=1))
        writer.write(record("lora_swap", "new", lora="[[0, 1.0]]"))  # schema 2: kept as written
    assert [r.lora for r in read_records(path)] == ["0:1", "", "0:0", "default", "[[0, 1.0]]"]


def test_causes_read_in_the_build_s_rules_in_the_report_the_page_and_json():
    # A hybrid's restore from disk: the file carries no checkpoints.
    restored = record("restore_disk", "resend", cache_n=0, prompt_n=32789)
    restored.cause, restored.extra = {"forced_full": True, "summary": "forced full"}, {"slot_from": "disk"}
    assert report.cause_words(restored) == ("a slot restored from disk carries no checkpoints: the whole prompt "
                                            "is re-processed")
    # The edit at 50%: the divergence, and no checkpoint before it.
    edit = record("edit_middle", "line at 50%", cache_n=0)
    edit.cause, edit.extra = {"forced_full": True}, {"diverges_at": 16428}
    assert report.cause_words(edit) == ("no checkpoint at or before the divergence (the prompt diverges at token "
                                        "16,428): the whole prompt is re-processed")
    # The re-ask: 32,788 tokens, back to the checkpoint at 32,273 = 515 before its end; it diverges at the question.
    reask = record("reask", "new question", cache_n=32273)
    reask.prompt_tokens, reask.cause = 32788, {"checkpoint_n_tokens": 32273, "ram_restored": True}
    reask.extra = {"diverges_at": 32771}
    assert report.cause_words(reask) == ("found in the RAM cache, then returned to the checkpoint 515 tokens before "
                                         "the end (n_tokens=32,273) (the prompt diverges at token 32,771)")
    # Records from before the structured cause: the log's summary as it was.
    old = record("reask", "new question", cache_n=0)
    old.cause = {"summary": "forced full re-processing (no checkpoint before divergence)"}
    assert report.cause_words(old) == old.cause["summary"]
    assert '"cause": "found in the RAM cache, then returned' in report.summary_json([reask])


def test_a_failed_step_s_error_is_whole_in_the_report() -> None:
    # cut at 40 characters, "HTTP 400: request (8211 tokens) exceeds the available context size" read "(821"
    failed = record("first_load", "cold", error="HTTP 400: request (8211 tokens) exceeds the available context size")
    assert "request (8211 tokens) exceeds the available context size" in report.render_text([failed], width=None)


def test_the_list_of_runs_says_each_run_s_status_and_links_a_prediction_to_its_verification(tmp_path: Path) -> None:
    # four runs as their commands leave them: a run with a failed call, an interrupted check, a prediction and
    # the replay that verified it (its run.json names the prediction's run)
    def run(name: str, kind: str, **selection: object) -> Path:
        path = tmp_path / "runs" / name
        path.mkdir(parents=True)
        provenance.write(path, provenance.Stamp(None, None, "server_profiles/tiny-llama.yaml", "0" * 64, {},
                                                kind=kind, selection=selection))
        (path / view.PAGE).write_text("<p>a page</p>")
        return path

    failed = run("20261207T000001-aaaaaa", "scenarios")
    with RecordWriter(failed / "records.jsonl") as writer:
        writer.write(RECORDS[0])
        writer.write(record("resend", "same prompt", error="HTTP 500"))
    check = run("20261207T000002-bbbbbb", "check")
    (check / run_kinds.CHECK_FILE).write_text('[{"profile": "tiny-llama", "incomplete": "interrupted", "verdicts": []}]')
    prediction = run("20261207T000003-cccccc", "whatif")
    (prediction / run_kinds.WHATIF_FILE).write_text('{"trace": {"name": "mooncake-conversation", "requests": 80}, '
                                                    '"ranked": []}')
    verification = run("20261207T000004-dddddd", "replay", prediction=prediction.name)
    (verification / "records.jsonl").write_text("")
    page = view.write_index(tmp_path).read_text()
    rows = {line.split("</a>")[0].rsplit(">", 1)[1]: line for line in page.split("<tr>")[2:]}
    assert "<td>1 failed</td>" in rows[failed.name]
    assert "<td>incomplete</td>" in rows[check.name]
    assert (f'verified: <a href="runs/{verification.name}/{view.PAGE}">' in rows[prediction.name]
            and "tiny-llama (trace mooncake-conversation)" in rows[prediction.name])
    assert "<td>no records</td>" in rows[verification.name]


@pytest.mark.e2e  # the model's memory is learned from a short start of its server the first time
def test_a_run_whose_windowed_model_missed_suggests_swa_full_and_advise() -> None:
    # tiny-gemma3 keeps a 128-token window on five of six layers: a restore that re-read everything, without
    # --swa-full, points at it; with --swa-full only advise is suggested; a run without a miss suggests nothing
    profile = profiles.load_profile("tiny-gemma3")
    missed = record("restore_disk", "resend", ideal=1, variant="swa-full=off")
    (window, advise) = next_steps(profile, [RECORDS[0], missed])
    assert window.startswith("next (swa-full=off): the model keeps only a 128-token window on 5 of 6 layers")
    assert advise == (f"next: `reusebench advise --profile {profile.path}` tries the launch changes that matter for "
                      "the 1 step(s) that should have hit and re-processed everything (restore_disk/resend)")
    assert next_steps(profile, [record("restore_disk", "resend", ideal=1, variant="swa-full=on")]) == [
        advise.replace("swa-full=off", "swa-full=on")]
    assert next_steps(profile, [RECORDS[0]]) == []  # the first load cannot hit


@pytest.mark.parametrize(("speculative", "extra"), [(True, {"draft_n": 0, "draft_accepted": 0}), (False, {})],
                         ids=["speculating", "not"])
def test_a_speculating_launch_s_answer_that_drafted_nothing_records_0_drafted(
        tmp_path: Path, speculative: bool, extra: dict) -> None:
    # b11434's timings leave draft_n out when nothing was drafted: every driver's recorder (session, workload,
    # replay) says 0 for a speculating launch, and nothing for one that does not speculate
    with RecordWriter(tmp_path / "records.jsonl") as writer:
        recorder = Recorder(writer, Source("p", "v", "m"), run=RunDir("r", tmp_path), session="s", size=1,
                            speculative=speculative)
        r = recorder.record("chat", "turn 1", Role.MEASURE, "/completion", started=0.0)
        recorder.fill(r, Completion(prompt_n=5, cache_n=0, prompt_ms=1.0, predicted_n=1, predicted_ms=1.0,
                                    tokens_evaluated=5, id_slot=0, ttft_ms=None, wall_ms=2.0, tokens=[1]))
    assert {k: r.extra[k] for k in ("draft_n", "draft_accepted") if k in r.extra} == extra
