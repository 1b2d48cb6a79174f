"""Every scenario of the catalogue, without a server and on a real llama-server with generated tiny models.

Without a server: each scenario, run against a recorder whatever it needs of a variant, measures
exactly the steps it declares, and those are the asv step parameters, unchanged.

On the server, at 2K tokens: one run per profile (module fixtures), then assertions on the records: the hybrid and the
pure-attention control over the whole catalogue, report B's LoRA swap on both, sleep off/on,
and the health-check probe with 1 and 4 slots, RAM cache on and off. The last test reads every
record and kept log these runs wrote and looks for any sentence of the prompts.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from reusebench import cli
from reusebench.capability import PINNED
from reusebench.config import corpus, profiles, scenarios
from reusebench.llama.client import Completion
from reusebench.records import Record, Role, read_records
from reusebench.run import provenance, runner
from reusebench.run.selection import Selection

SIZE = 2048


@dataclass
class Run:
    output: str  # what the session printed
    records: list[Record]
    files: list[Path]  # what it kept: its records and its scrubbed server logs

    def measured(self, variant: str | None = None) -> dict[tuple[str, str], Record]:
        return {(r.scenario, r.step): r for r in self.records
                if r.role == Role.MEASURE and variant in (None, r.variant)}

    def step(self, scenario: str, step: str, variant: str | None = None, role: str = "measure") -> Record:
        found = [r for r in self.records if (r.scenario, r.step, r.role) == (scenario, step, role)
                 and variant in (None, r.variant)]
        assert len(found) == 1, (scenario, step, variant, role, len(found))
        return found[0]


def run(profile: str, results: Path, scenario_ids: tuple[str, ...] = ()) -> Run:
    out = io.StringIO()
    result = runner.run_profile(profiles.load_profile(profile), Selection(sizes=(SIZE,), scenario_ids=tuple(scenario_ids)),
                                results_dir=results, out=out)
    assert result.failed_sessions == 0, out.getvalue()
    return Run(out.getvalue(), result.records, [result.records_path, *(result.run_dir / "logs").glob("*.log")])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="module")
def hybrid(results: Path) -> Run:
    """The whole catalogue on the long-memory Mamba2 hybrid with --cache-reuse 256 (where chunk_removed reuses a
    recurrent state that still holds the removed text)."""
    return run("tiny-granitehybrid-longmem", results)


@pytest.fixture(scope="module")
def control(results: Path) -> Run:
    return run("tiny-llama", results)


@pytest.fixture(scope="module")
def lora_hybrid(results: Path) -> Run:
    return run("tiny-lora", results)


@pytest.fixture(scope="module")
def lora_control(results: Path) -> Run:
    return run("tiny-lora-llama", results)


@pytest.fixture(scope="module")
def sleep(results: Path) -> Run:
    return run("tiny-sleep", results)


@pytest.fixture(scope="module")
def probe(results: Path) -> Run:
    return run("tiny-probe", results)


# -- no server -------------------------------------------------------------------------------


def test_remove_lines_cuts_whole_lines_near_the_start():
    document = "\n".join(f" line {i} of the text" for i in range(100))
    cut = scenarios.remove_lines(document, 0.1, 0.1)
    kept = cut.split("\n")
    assert all(line in document.split("\n") for line in kept)  # no line split in two
    assert " line 5 of the text" in kept and " line 15 of the text" not in kept and " line 30 of the text" in kept
    assert 0.85 < len(kept) / 100 < 0.95


# The asv step parameters, as asv's history knows them: a change here renames a results series.
ASV_STEPS = {
    "first_load/cold",
    "after_sleep/same prompt after sleeping",
    "resend/same prompt",
    "chunk_removed/10% cut at 10%",
    "interleave/back to first",
    "probe_eviction/next turn",
    "reask/new question",
    "edit_middle/line at 50%",
    "head_insert/summary at the head",
    "growth/turn 1",
    "growth/turn 2",
    "growth/turn 3",
    "growth/turn 4",
    "restore_disk/resend",
    "restore_disk/reask",
    "restore_disk/extension",
    "lora_swap/P + more, same LoRA",
    "lora_swap/P + more, no LoRA",
}


class Recorder:
    """The Steps a scenario sees, without a server: it records every call as (kind, scenario, step)."""

    document, other, edited, summary = "D " * 50, "O " * 50, "E " * 50, "S"
    questions = ("Q1", "Q2")
    lora_adapters = 1
    multimodal = False
    images = False
    capabilities = PINNED
    slot_actions = True
    n_slots, ram_cache, sleep_idle_s = 4, True, None  # llama-server's defaults: auto slots, a RAM cache, no sleep

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def prompt(self, document: str, question: str) -> str:
        return f"{document}\n{question}"

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        return list(range(len(text.split()) + bos))

    def _completion(self) -> Completion:
        return Completion(prompt_n=1, cache_n=0, prompt_ms=1.0, predicted_n=1, predicted_ms=1.0, tokens_evaluated=1,
                          id_slot=0, ttft_ms=1.0, wall_ms=1.0, tokens=[7])

    def saved_tokens(self, filename: str) -> list[int]:
        return [1, 2, 3]

    def measure(self, scenario: str, step: str, prompt: object, **kwargs: object) -> None:
        self.calls.append(("measure", scenario, step))

    def setup(self, scenario: str, step: str, prompt: object, **kwargs: object) -> Completion:
        self.calls.append(("setup", scenario, step))
        return self._completion()

    def chat(self, scenario: str, step: str, messages: object, **kwargs: object) -> str:
        self.calls.append(("measure", scenario, step))
        return "reply"

    def save_slot(self, scenario: str, filename: str) -> None:
        self.calls.append(("save", scenario, filename))

    def restore_slot(self, scenario: str, filename: str) -> None:
        self.calls.append(("restore", scenario, filename))

    def restart(self, scenario: str) -> None:
        self.calls.append(("restart", scenario, ""))

    def wait_until_asleep(self, scenario: str) -> None:
        self.calls.append(("wait", scenario, ""))


def measured_by(scenario: scenarios.Scenario) -> list[str]:
    """Run the scenario whatever it needs of a variant, and return the steps it measured, in order."""
    recorder = Recorder()
    scenario.run(recorder)
    assert {s for _, s, _ in recorder.calls} == {scenario.id}  # every call is labelled with its own scenario
    return [step for kind, _, step in recorder.calls if kind == "measure"]


@pytest.mark.parametrize("scenario", scenarios.CATALOGUE, ids=scenarios.SCENARIO_IDS)
def test_a_scenario_measures_exactly_the_steps_it_declares(scenario):
    assert measured_by(scenario) == list(scenario.measures)


def test_the_asv_step_parameters_are_the_declared_steps_unchanged():
    from benchmarks import common

    assert set(scenarios.MEASURED_STEPS) == ASV_STEPS  # both directions: none added, none renamed or dropped
    assert len(scenarios.MEASURED_STEPS) == len(ASV_STEPS)
    assert common.STEPS == scenarios.MEASURED_STEPS and common.FIRST_LOAD == "first_load/cold"
    # the label is a literal; it must still say what the constants cut
    assert scenarios.CHUNK_STEP == f"{scenarios.CHUNK_LENGTH:.0%} cut at {scenarios.CHUNK_AT:.0%}"


def test_selection_keeps_catalogue_order_and_always_starts_with_the_first_load():
    assert [sc.id for sc in scenarios.select(["reask", "resend"])] == ["first_load", "resend", "reask"]
    assert scenarios.select(None) == list(scenarios.CATALOGUE)
    with pytest.raises(ValueError, match=r"unknown scenario\(s\) resned; known: first_load, after_sleep"):
        scenarios.select(["resned"])


def test_restore_disk_saves_its_own_slot_only_without_interleave():
    def calls(ids: list[str]) -> list[tuple[str, str, str]]:
        recorder = Recorder()
        for scenario in scenarios.select(ids):
            scenario.run(recorder)
        return recorder.calls

    alone = calls(["restore_disk"])
    saved = alone.index(("save", "restore_disk", scenarios.SAVED_SLOT))
    assert alone[saved - 1] == ("setup", "restore_disk", "document + first question")  # D + Q1 in the slot first
    assert saved < alone.index(("restart", "restore_disk", "")) < alone.index(("restore", "restore_disk",
                                                                               scenarios.SAVED_SLOT))
    after_interleave = calls(["interleave", "restore_disk"])
    assert [c for c in after_interleave if c[0] == "save"] == [("save", "interleave", scenarios.SAVED_SLOT)]
    assert [c for c in after_interleave if c[1] == "restore_disk"] == [c for c in alone if c[1] == "restore_disk"][2:]


def test_a_build_that_refuses_slot_files_with_an_mmproj_makes_restore_disk_not_applicable_there() -> None:
    # 2026-03 answers HTTP 501 to every slot action while an mmproj is loaded: no save after interleave, and
    # restore_disk is n/a with the reason, not a failed scenario
    recorder = Recorder()
    recorder.multimodal, recorder.slot_actions = True, False
    by_id = {sc.id: sc for sc in scenarios.CATALOGUE}
    assert by_id["restore_disk"].not_applicable(recorder) == (
        "this build refuses slot files while an mmproj is loaded (reusebench probe)")
    by_id["interleave"].run(recorder)
    assert [c for c in recorder.calls if c[0] == "save"] == []
    recorder.slot_actions = True  # b11434 saves a text-only slot with an mmproj loaded
    assert by_id["restore_disk"].not_applicable(recorder) is None


# -- the hybrid and the control over the whole catalogue ------------------------------------------


@pytest.mark.e2e
def test_every_scenario_ran_or_said_why_not(hybrid, control):
    for result in (hybrid, control):
        ran = {r.scenario for r in result.records if r.role == Role.MEASURE}
        assert ran == set(scenarios.SCENARIO_IDS) - {"after_sleep", "lora_swap"}
        assert "after_sleep: not applicable to this variant, nothing recorded: needs sleep-idle-seconds > 0" \
            in result.output
        assert "lora_swap: not applicable to this variant, nothing recorded: needs a LoRA adapter" in result.output
        assert not [r for r in result.records if r.scenario in ("after_sleep", "lora_swap")]


@pytest.mark.e2e
def test_cache_reuse_after_a_chunk_removed_is_flagged_as_wrong_output_on_the_hybrid(hybrid):
    cut = hybrid.step("chunk_removed", "10% cut at 10%")
    assert cut.cache_n > cut.prompt_tokens / 2  # looks like a success ...
    assert cut.matches_reference is False and cut.verdict == "WRONG OUTPUT"  # ... and is not: the state is stale
    assert cut.cause["cache_reuse_chunks"] and cut.cause["checkpoint_n_tokens"] is not None
    assert cut.extra["foreign_reused"] > 0


@pytest.mark.e2e
def test_plain_resend_and_reask_pass_the_correctness_check(hybrid, control):
    for result in (hybrid, control):
        for step in (("resend", "same prompt"), ("reask", "new question"), ("interleave", "back to first")):
            record = result.step(*step)
            assert record.cache_n > 0 and record.matches_reference is True, (record.session, step)
            assert record.extra["output_check"] in ("identical", "within noise"), (record.session, step)


@pytest.mark.e2e
def test_control_without_cache_reuse_keeps_exactly_the_prefix_before_the_cut(control):
    cut = control.step("chunk_removed", "10% cut at 10%")
    assert cut.prompt_n == cut.ideal and cut.matches_reference is True


@pytest.mark.e2e
def test_probe_between_turns_is_served_from_ram_with_one_slot(hybrid, control):
    for result in (hybrid, control):
        probe = result.step("probe_eviction", "21-token probe", role="setup")
        assert probe.prompt_tokens == scenarios.PROBE_TOKENS
        assert probe.cause["selection"] == "lcp" and probe.cause["f_sim"] == 1.0  # it took the big slot
        after = result.step("probe_eviction", "next turn")
        assert after.prompt_n <= after.ideal + 4 and after.cause["ram_restored"]


@pytest.mark.e2e
def test_head_insert_is_a_full_prefill_counted_as_cannot_hit(hybrid, control):
    for result in (hybrid, control):
        head = result.step("head_insert", "summary at the head")
        assert head.expected_hit is False and head.verdict == "full (cannot hit)"
        assert head.prompt_n >= head.prompt_tokens - 2


@pytest.mark.e2e
def test_growing_chat_reprocesses_only_the_appended_tokens(hybrid, control):
    for result in (hybrid, control):
        turns = [result.step("growth", step) for step in scenarios.GROWTH_STEPS]
        assert all(t.endpoint == "/v1/chat/completions" for t in turns)
        assert turns[0].expected_hit is False and turns[0].prompt_n >= turns[0].prompt_tokens - 1
        for before, turn in zip(turns, turns[1:]):
            assert turn.ideal == turn.prompt_tokens - before.prompt_tokens - before.predicted_n  # the appended tokens
            assert turn.prompt_n <= turn.ideal + 4 and turn.verdict == "hit"
            assert turn.matches_reference is True  # chat outputs are compared too (ids and logprobs)


@pytest.mark.e2e
def test_honest_denominators_count_cannot_hit_turns_apart(hybrid):
    from reusebench.report.run_report import render_text

    text = render_text(hybrid.records)
    assert "turns that cannot hit, counted apart: 3 (first_load/cold, head_insert/summary at the head, growth/turn 1)" \
        in text
    assert "setup prefills (not measured): 3" in text and "interleave/other document" in text


# -- report B's LoRA swap ----------------------------------------------------------------------


@pytest.mark.e2e
def test_lora_swap_reproduces_report_b_on_the_hybrid_and_the_control(lora_hybrid, lora_control):
    for result in (lora_hybrid, lora_control):
        regression = result.step("lora_swap", "P + more, same LoRA")
        assert regression.cache_n == 0 and regression.prompt_n == regression.prompt_tokens
        assert regression.ideal < 32  # a LoRA-aware cache would re-process only the new turn
        assert regression.cause["summary"] == "LoRA-change clear after restoring from RAM"
        assert regression.verdict == "miss"


@pytest.mark.e2e
def test_lora_state_served_without_lora_is_flagged(lora_hybrid, lora_control):
    for result in (lora_hybrid, lora_control):
        served = result.step("lora_swap", "P + more, no LoRA")
        assert served.cache_n > served.prompt_tokens - 8 and served.cause["ram_restored"]
        assert served.expected_hit is False  # never computed without LoRA: a correct cache cannot hit
        assert served.extra["foreign_reused"] > served.prompt_tokens - 8
    # The control's adapter moves the output visibly; the tiny hybrid's (one attention layer) stays in tolerance.
    assert lora_control.step("lora_swap", "P + more, no LoRA").verdict == "WRONG OUTPUT"
    assert lora_hybrid.step("lora_swap", "P + more, no LoRA").verdict in ("WRONG OUTPUT", "FOREIGN REUSE")


# -- sleep -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_after_sleep_the_cache_is_lost_and_the_record_says_the_server_slept(sleep):
    woke = sleep.step("after_sleep", "same prompt after sleeping", variant="sleep-idle-seconds=3")
    assert woke.cache_n == 0 and woke.prompt_n == woke.prompt_tokens
    assert woke.cause["woke"] and woke.cause["summary"].startswith("woke from sleep")
    assert woke.expected_hit is False and woke.verdict == "full (cannot hit)"
    wait = sleep.step("after_sleep", "idle until asleep", variant="sleep-idle-seconds=3", role="setup")
    assert wait.endpoint == "/props" and wait.extra["n_polls"] >= 1


@pytest.mark.e2e
def test_after_sleep_is_not_applicable_without_sleep_and_records_nothing(sleep):
    assert not [r for r in sleep.records if r.scenario == "after_sleep" and r.variant == "sleep-idle-seconds=-1"]
    assert "after_sleep: not applicable to this variant, nothing recorded: needs sleep-idle-seconds > 0 " \
           "(this variant: -1)" in sleep.output


# -- probe with 1 and 4 slots ------------------------------------------------------------------


@pytest.mark.e2e
def test_probe_costs_the_conversation_only_without_a_ram_cache(probe):
    def next_turn(variant: str) -> Record:
        return probe.step("probe_eviction", "next turn", variant=variant)

    for slots in ("parallel=1", "parallel=-1"):
        with_ram = next_turn(f"{slots},cache-ram=8192")
        assert with_ram.verdict == "hit" and with_ram.cause["ram_restored"]
        without_ram = next_turn(f"{slots},cache-ram=0")
        assert without_ram.cache_n <= scenarios.PROBE_TOKENS  # at most the probe's own prefix
    assert next_turn("parallel=-1,cache-ram=8192").slot != probe.step(
        "probe_eviction", "conversation turn", variant="parallel=-1,cache-ram=8192", role="setup").slot


# -- a scenario alone ---------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.smoke
def test_restore_disk_alone_saves_its_own_slot(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """`reusebench run --scenario first_load --scenario restore_disk`: no interleave saved the slot it restores."""
    status = cli.main(["run", "--profile", "tiny-qwen35", "--variant", "mmproj=off,cache-reuse=0", "--size", "2K",
                       "--scenario", "first_load", "--scenario", "restore_disk", "--results", str(tmp_path)])
    assert status == 0, capsys.readouterr().err
    (run_dir,) = (tmp_path / "runs").iterdir()
    stamp = provenance.read(run_dir)
    assert (stamp.kind, stamp.selection["scenarios"], stamp.selection["sizes"]) == (
        "scenarios", ["first_load", "restore_disk"], [SIZE])
    model = profiles.load_profile("tiny-qwen35").variant("mmproj=off,cache-reuse=0").model
    assert stamp.launches["mmproj=off,cache-reuse=0"][:2] == ["-m", str(model)]  # the launch as it was resolved
    written = read_records(run_dir / "records.jsonl")
    setup = [(r.scenario, r.step) for r in written if r.role == Role.SETUP]
    assert setup[:2] == [("restore_disk", "document + first question"), ("restore_disk", "save slot")]
    assert not [r for r in written if r.error]
    extension = next(r for r in written if (r.scenario, r.step, r.role) == ("restore_disk", "extension", "measure"))
    assert extension.cache_n > SIZE and extension.prompt_n <= extension.ideal + 4  # the saved D + Q1 was restored


# -- the reuse model ---------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_reuse_model_expects_every_measured_step_of_the_pinned_build(
    hybrid, control, lora_hybrid, lora_control, sleep, probe
):
    """Expected vs measured on every run of this module: no step is UNEXPECTED, and the known wrong outputs
    (cache-reuse on the long-memory hybrid, the LoRA-computed RAM entry) are predicted as such."""
    for run_ in (hybrid, control, lora_hybrid, lora_control, sleep, probe):
        measured = [r for r in run_.records if r.role == Role.MEASURE]
        off = [f"{r.variant} {r.scenario}/{r.step}: expected {r.expected} ({r.cause_expected}), measured {r.prompt_n} "
               f"({r.cause['summary']})" for r in measured if r.prompt_n != r.expected]
        assert not off, off
        assert all(r.verdict != "UNEXPECTED" for r in measured)
    assert hybrid.step("chunk_removed", scenarios.CHUNK_STEP).extra["expected_wrong_output"]
    for run_ in (lora_hybrid, lora_control):
        assert run_.step("lora_swap", "P + more, no LoRA").extra["expected_wrong_output"]
        assert run_.step("lora_swap", "P + more, same LoRA").cause_expected == \
            "LoRA-change clear after restoring from RAM"


# -- privacy -----------------------------------------------------------------------------------


def prompt_sentences() -> list[str]:
    spec = corpus.load_spec("tiny-words")
    lines = [line.strip() for variant in (0, 1) for line in corpus.source_text(spec, variant, 20_000).splitlines()]
    texts = [*lines[:-1], *spec.questions, spec.edit, spec.summary]  # the last line may be cut short
    return sorted({t.strip() for t in texts if len(t.strip().split()) >= 6})


@pytest.mark.e2e
def test_no_record_and_no_kept_log_contains_a_sentence_of_the_prompts(
    hybrid, control, lora_hybrid, lora_control, sleep, probe
):
    sentences = prompt_sentences()
    assert len(sentences) > 100
    runs = (hybrid, control, lora_hybrid, lora_control, sleep, probe)
    files = [f for each in runs for f in each.files]
    assert len([f for f in files if f.suffix == ".log"]) >= len(runs)  # the kept logs exist and are checked
    for path in files:
        text = path.read_text()
        assert text
        leaked = [s for s in sentences if s in text]
        assert not leaked, f"{path.name} contains prompt text: {leaked[0][:40]}..."
