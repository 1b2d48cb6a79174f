"""The plan of a run, before any server starts: requests, tokens, the prefills the reuse model expects, which
steps stop once their count is known, and the estimate of time left from the first load's rate."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reusebench import cli
from reusebench.capability import PINNED, cache, learned_memory
from reusebench.capability.build import Build
from reusebench.config import corpus, profiles, scenarios
from reusebench.llama import binaries
from reusebench.llama.process import ServerProcess
from reusebench.records import Record, Role, read_records
from reusebench.run import launch, plan, provenance

REPORT_A = ("first_load", "resend", "interleave", "reask", "edit_middle", "restore_disk")
K32 = 32768


def report_a(profile: str, variant: str, *, early_stop: bool) -> plan.SessionPlan:
    chosen = profiles.load_profile(profile).variant(variant)
    pinned = Build(chosen.binary, PINNED, binaries.help_table(chosen.binary))  # the pinned rules, whatever it probes
    spec = launch.resolve(chosen, pinned, context=launch.session_context(K32), early_stop=early_stop)
    return plan.plan_session(spec, K32, scenarios.select(REPORT_A), corpus.load_spec("tiny-words"), name="s")


def full(session: plan.SessionPlan) -> list[str]:
    """The calls that prefill more than half a document."""
    return [f"{c.scenario}/{c.step}" for c in session.calls if c.prefill > K32 // 2]


@pytest.mark.e2e
def test_report_a_on_the_hybrid_prefills_four_documents_with_early_stop_and_six_without():
    early = report_a("tiny-qwen35", "mmproj=on,cache-reuse=256", early_stop=True)
    timed = report_a("tiny-qwen35", "mmproj=on,cache-reuse=256", early_stop=False)
    # The first load, the other document, the first re-ask's reference (judged before the restart forgets the
    # slot) and the extension's at the end ("/reference"): four. The edit and the resend and re-ask after the
    # restore re-process everything on a hybrid, and nothing needs their output: they stop at their count.
    assert full(early) == ["first_load/cold", "interleave/other document", "/reference", "/reference"]
    assert [f"{c.scenario}/{c.step}" for c in early.calls if c.stops] == ["edit_middle/line at 50%",
                                                                         "restore_disk/resend", "restore_disk/reask"]
    assert full(timed) == ["first_load/cold", "interleave/other document", "edit_middle/line at 50%", "/reference",
                           "restore_disk/resend", "restore_disk/reask", "/reference"]
    assert len(early.calls) == len(timed.calls) == 11  # the same requests go out either way
    assert round(early.prefill / K32) == 4 and round(timed.prefill / K32) == 7


@pytest.mark.e2e
def test_the_control_reuses_half_the_edited_document_so_nothing_stops():
    # Pure attention keeps the KV of the document's first half: the edit reuses it, so its output is checked
    # against a no-reuse reference, and a checked step never stops.
    control = report_a("tiny-llama", "default", early_stop=True)
    assert not any(c.stops for c in control.calls)
    assert control.calls == report_a("tiny-llama", "default", early_stop=False).calls


@pytest.mark.e2e
def test_dry_run_prints_the_plan_and_starts_no_server(capsys, tmp_path, monkeypatch):
    # the build's rules and the model's memory are learned from short starts the first time, then kept: here first
    variant = profiles.load_profile("tiny-qwen35").variant("mmproj=on,cache-reuse=256")
    learned_memory.of_model(variant.binary, variant.model)
    cache.of_binary(variant.binary)
    monkeypatch.setattr(ServerProcess, "start", lambda self: pytest.fail("a dry run started a server"))
    assert cli.main(["run", "--profile", "tiny-qwen35", "--variant", "mmproj=on,cache-reuse=256", "--size", "32K",
                     *(arg for step in REPORT_A for arg in ("--scenario", step)), "--dry-run", "--results", str(tmp_path)]) == 0
    assert not any(tmp_path.iterdir())  # no run directory either
    out = capsys.readouterr().out
    assert out.startswith("plan: 1 session(s), 11 requests; the reuse model expects ")
    assert max(map(len, out.splitlines())) <= 100  # the session's line wraps, its continuation indented
    said = " ".join(out.split())
    assert "(4.0 documents of 32K), 3 step(s) stopped at their count, 2 no-reuse reference(s)" in said


def record(scenario: str, step: str, role: Role = Role.MEASURE, prompt_n: int = 0, prompt_ms: float | None = None
           ) -> Record:
    return Record(run_id="r", session="s", profile="p", variant="v", build="b", model="m", size=K32,
                  scenario=scenario, step=step, role=role, endpoint="/completion", started_at=0.0, ended_at=0.0,
                  prompt_n=prompt_n, prompt_ms=prompt_ms)


def test_the_estimate_follows_the_first_load_rate_and_the_planned_calls_left():
    session = plan.SessionPlan("s", K32, [plan.PlannedCall("first_load", "cold", Role.MEASURE, K32, K32),
                                          plan.PlannedCall("resend", "same prompt", Role.MEASURE, K32, 4),
                                          plan.PlannedCall("", "reference", Role.REFERENCE, K32, K32)])
    out = io.StringIO()
    estimate = plan.Estimate([session], out)
    # 32,768 tokens in 8 s: 4,096 tokens/s; left: the resend's 4 and the reference's 32,768 = 32,772 tokens,
    # 32,772 / 4,096 = 8.0 s.
    estimate.done("s", record("first_load", "cold", prompt_n=K32, prompt_ms=8000.0))
    assert out.getvalue() == ("estimate: 8 s of prefill left in this run (32,772 tokens at the last first load's "
                              "4,096 tokens/s); a noise band, where a reused output differs, comes on top\n")
    assert estimate.of(4096 * 95) == "about 1 min 35 s"  # what a noise band's prompts will take, said before it
    estimate.done("s", record("resend", "same prompt", prompt_n=4, prompt_ms=1.0))
    assert out.getvalue().count("\n") == 1  # said again only after ESTIMATE_EVERY_S
    estimate.session_ended("s")
    assert estimate.left == {"s": []}


def test_an_estimate_with_nothing_left_does_not_read_as_zero_seconds():
    session = plan.SessionPlan("s", K32, [plan.PlannedCall("first_load", "cold", Role.MEASURE, K32, K32)])
    out = io.StringIO()
    plan.Estimate([session], out).done("s", record("first_load", "cold", prompt_n=K32, prompt_ms=8000.0))
    assert out.getvalue() == ("estimate: no planned prefill left in this run; a noise band, where a reused output "
                              "differs, comes on top\n")


def test_a_launch_resolves_only_on_its_own_binarys_build(tmp_path: Path) -> None:
    # A spec predicts with its Build's rules, so a Build of another binary would predict with rules not its own.
    variant = profiles.load_profile("tiny-llama").variants[0]
    elsewhere = Build(binaries.Binary(tmp_path / "llama-server"), PINNED, {})
    with pytest.raises(ValueError, match=f"resolved with the build of {tmp_path}/llama-server, not its own binary"):
        launch.resolve(variant, elsewhere, context=None)


@pytest.mark.e2e
def test_two_slots_of_their_own_each_hold_the_size_run_with_no_ctx_size(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # a newcomer's profile: parallel 2 and no ctx-size. Two slots that do not share a KV pool each get half of the
    # context, so each needs the 2,048-token document plus the margin: --ctx-size (2,048 + 1,024) x 2 = 6,144. It
    # was 3,072 (3,072 / 2 = 1,536 a slot: the server refused the document with HTTP 400 after the run began)
    profile = tmp_path / "mine.yaml"
    profile.write_text("extends: tiny-base\nmodel: tiny:llama\noptions:\n  parallel: 2\n")
    assert cli.main(["run", "--profile", str(profile), "--size", "2K", "--scenario", "first_load", "--scenario",
                     "resend", "--results", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    (run,) = (tmp_path / "r" / "runs").iterdir()
    (launch,) = provenance.read(run).launches.values()
    assert launch[launch.index("--ctx-size") + 1] == "6144"
    measured = [r for r in read_records(run / "records.jsonl") if r.role == Role.MEASURE]
    assert [r.scenario for r in measured] == ["first_load", "resend"] and not [r for r in measured if r.error]
