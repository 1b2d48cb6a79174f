"""The asv suite through asv itself: discovery, replaying a run's records, and the nightly flow over two
"llama.cpp" commits. (That the step parameters are the scenarios' declared steps: tests/test_scenarios.py.)

The nightly test stands a throwaway git repository in for llama.cpp. Its CMake
`llama-server` target "builds" a launcher that execs the default llama-server.
`reusebench nightly` measures its one commit; then a second commit adds
`--ctx-checkpoints 0` (last flag wins), which makes the hybrid re-ask re-process
the whole prompt instead of the ~515 tokens after the last checkpoint, and the next
night measures only that one. asv builds each with `reusebench build --asv-env`,
runs the suite at 2K tokens and publishes; `reusebench compare` must flag the
regression.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asv
import gguf
import pytest
from asv_runner.benchmarks.mark import SkipNotImplemented

from reusebench import records, tiny
from reusebench.config import profiles
from reusebench.llama import binaries
from reusebench.report import asv_results, site
from reusebench.run import provenance

from conftest import default_llama_server

REPO = Path(__file__).resolve().parents[1]
MACHINE = "reusebench-ci"
VARIANT = "mmproj=off,cache-reuse=0"
REASK = "reask/new question"
AFTER_SLEEP = "after_sleep/same prompt after sleeping"  # needs sleep-idle-seconds, which tiny-qwen35 leaves unset


def asv_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REUSEBENCH_", "ASV"))}
    env.update(
        HOME=str(tmp_path / "home"),  # asv keeps its machine file in ~/.asv-machine.json
        REUSEBENCH_MODEL_CACHE=str(tiny.default_cache_dir()),  # resolved with the real HOME: no regeneration
        REUSEBENCH_SITE_ASSETS=str(site.cache_dir()),  # the site's libraries `make site-assets` fetched
        REUSEBENCH_RESULTS=str(tmp_path / "records"),
        REUSEBENCH_LLAMA_BUILD_CACHE=str(tmp_path / "builds"),
        REUSEBENCH_LLAMA_SERVER=str(default_llama_server()),  # the default build lives in the real cache
        REUSEBENCH_ASV_SIZES="2048",
        REUSEBENCH_ASV_VARIANTS=VARIANT,
        REUSEBENCH_ASV_WORKLOAD="",  # the workloads' minutes are tests/test_service_load.py's, not these flows'
        REUSEBENCH_ASV_INTERFERENCE="",
        REUSEBENCH_ASV_TRACE="",  # the replay's counts are tests/test_replay.py's
        **overrides,
    )
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def run_asv(env: dict[str, str], *args: str, timeout: float = 150) -> str:
    done = subprocess.run([sys.executable, "-m", "asv", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"asv {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def discover(tmp_path: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """asv's own discovery command, as `asv run` calls it: {benchmark name: its description}."""
    out = tmp_path / "benchmarks.json"
    command = [sys.executable, str(Path(asv.__file__).parent / "benchmark.py"), "discover", str(REPO / "benchmarks"),
               str(out)]
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=60)
    return {b["name"]: b for b in json.loads(out.read_text())}


def test_discovery_finds_every_benchmark(tmp_path: Path) -> None:
    env = asv_env(tmp_path)
    assert "No problems found" in run_asv(env, "check", "--python=same", timeout=60)
    found = discover(tmp_path, env)
    assert set(found) == {
        "reuse.FirstLoad.track_prefill_seconds",
        "reuse.FirstLoad.track_ttft_seconds",
        "reuse.StepSeconds.track_prefill_seconds",
        "reuse.StepSeconds.track_ttft_seconds",
        "reuse.ReprocessedTokens.track_reprocessed_tokens",
        "reuse.ReprocessedTokens.track_excess_over_ideal",
        "reuse.ExpectedTokens.track_deviation_from_expected",
        "correctness.ReusedOutputMismatch.track_mismatch",
        "speculation.Speculation.track_drafted_tokens",
        "speculation.Speculation.track_accepted_tokens",
        "speculation.Speculation.track_rolled_back_drafts",
        "speculation.Speculation.track_decode_seconds",
        "images.Images.track_image_tokens_reprocessed",
        "images.Images.track_images_encoded",
        "images.Images.track_image_encode_seconds",
        *(f"gpu_state.FirstLoadGpuState.track_{name}"
          for name in ("start_temperature_c", "sm_clock_mean_mhz", "throttled_fraction", "idle_before_s",
                       "model_page_cache_fraction")),
        *(f"gpu_state.FirstLoadSpread.track_{name}_seconds" for name in ("min", "median", "max")),
        "gpu_state.MachineBusy.track_busy",
        "harness.PrefillBudget.track_prefill_budget_ratio",
        "harness.PrefillBudget.track_extra_prefill_tokens",
        "harness.PrefillBudget.track_documents_prefilled",
        *(f"harness.HarnessOverhead.track_{name}" for name in ("overhead_seconds", "overhead_percent",
                                                                "ttft_minus_prompt_seconds")),
        "harness.CorpusBuilding.track_corpus_seconds",
        "harness.CorpusBuilding.track_corpus_tokenizer_calls",
        "verdicts.OptionVerdict.track_verdict_code",
        "service.WorkloadMisses.track_missed_turns",
        "service.WorkloadInterference.track_other_users_ms",
        "replay.TraceReplay.track_reprocessed_tokens",
        "replay.TraceReplaySeconds.track_prefill_seconds",
        "replay.TraceReplayBusy.track_busy",
    }
    # One session per commit feeds every figure; the option check and the two workloads are their own runs.
    own_runs = ("verdicts.", "service.", "replay.")
    session_keys = {b["setup_cache_key"] for name, b in found.items() if not name.startswith(own_runs)}
    workload_keys = {b["setup_cache_key"] for name, b in found.items() if name.startswith("service.")}
    replay_keys = {b["setup_cache_key"] for name, b in found.items() if name.startswith("replay.")}
    assert len(workload_keys) == 2 and not workload_keys & session_keys
    assert len(replay_keys) == 1 and not replay_keys & (session_keys | workload_keys)  # one replay feeds both
    assert "'cause: LoRA-change clear after restore'" in found["service.WorkloadMisses.track_missed_turns"]["params"][0]
    assert session_keys == {found["reuse.FirstLoad.track_prefill_seconds"]["setup_cache_key"]}
    variants, checked = found["verdicts.OptionVerdict.track_verdict_code"]["params"]
    assert variants == [repr(VARIANT)] and {"'cache-reuse'", "'ctx-checkpoints'", "'cache-ram'"} <= set(checked)
    size, variant, steps = found["reuse.ReprocessedTokens.track_reprocessed_tokens"]["params"]
    assert (size, variant) == (["'2K'"], [repr(VARIANT)])
    assert repr(REASK) in steps and "'first_load/cold'" not in steps
    # version 2: renamed for the web UI; the service figures, measured anew (the serial schedule, repeated timings);
    # the prefill budget, which counts what was really prefilled (early stop)
    renamed = ("reuse.FirstLoad.", "reuse.StepSeconds.", "gpu_state.FirstLoad", "service.", "harness.PrefillBudget.")
    assert all(b["version"] == ("2" if name.startswith(renamed) else "1") for name, b in found.items())


# --- replaying the records of a run (make bench) ------------------------------------------------


def replay_records(run_dir: Path, stamp: provenance.Stamp, failures: list[str] | None = None) -> Path:
    """A run directory as `reusebench run` leaves it: records.jsonl and its stamp. With `failures`, one session
    whose server died at start-up (its summary record only), beside one that measured the first load."""
    run_dir.mkdir(parents=True)
    provenance.write(run_dir, stamp)
    path = run_dir / "records.jsonl"

    def record(session: str, scenario: str, step: str, role: str, **fields: Any) -> records.Record:
        return records.Record(run_id="r", session=session, profile="tiny-qwen35", variant=VARIANT, build="b",
                              model="tiny:qwen35", size=2048 if session.endswith("2048") else 4096,
                              scenario=scenario, step=step, role=role, endpoint="", started_at=0.0, ended_at=0.0,
                              **fields)

    with records.RecordWriter(path) as writer:
        writer.write(record("s@2048", "first_load", "cold", "measure", prompt_n=2048, prompt_ms=1000.0))
        writer.write(record("s@2048", records.Role.SESSION, "summary", records.Role.SESSION,
                            extra={"failures": []}))
        if failures is not None:
            writer.write(record("s@4096", records.Role.SESSION, "summary", records.Role.SESSION,
                                extra={"failures": failures}))
    return path


def current_stamp() -> provenance.Stamp:
    return provenance.stamp(profiles.load_profile("tiny-qwen35", check_binary=False), [VARIANT])


def test_replay_refuses_records_of_another_reusebench_commit(tmp_path: Path) -> None:
    now = current_stamp()
    assert now.reusebench_commit and len(now.reusebench_commit) == 40  # this checkout's HEAD
    other = dataclasses.replace(now, reusebench_commit="0" * 40)
    path = replay_records(tmp_path / "run", other)
    env = {**asv_env(tmp_path), "REUSEBENCH_ASV_RECORDS": str(path)}
    imported = subprocess.run([sys.executable, "-c", "import benchmarks.common as c; print(c.SIZES, c.VARIANTS)"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    # discovery reads the parameters from the records alone and checks nothing: the refusal waits for setup_cache
    assert imported.returncode == 0 and imported.stdout.strip() == f"['2K'] ['{VARIANT}']", imported.stderr
    done = subprocess.run([sys.executable, "-c", "import benchmarks.common as c; c.SessionFigures().setup_cache()"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"benchmarks.common.ReplayRefused: REUSEBENCH_ASV_RECORDS={path}: refused: it was measured with "
        f"reusebench commit {'0' * 40} (now {now.reusebench_commit})")


def test_replay_refuses_another_profile_or_binary_and_any_nightly(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import common

    now = current_stamp()
    assert common.replay(replay_records(tmp_path / "same", now))[1]  # what asv benchmarks now: published
    changed = dataclasses.replace(now, profile_sha256="0" * 64, binaries={VARIANT: "b1 (elsewhere; cpu, )"})
    with pytest.raises(common.ReplayRefused) as refused:
        common.replay(replay_records(tmp_path / "changed", changed))
    assert str(refused.value).endswith(
        f"it was measured with profile {now.profile} as it was then (its content has changed since); "
        f"llama-server b1 (elsewhere; cpu, ) for {VARIANT} (now {now.binaries[VARIANT]})")
    monkeypatch.setenv("ASV_ENV_DIR", str(tmp_path))
    with pytest.raises(common.ReplayRefused, match="refused: asv built this environment"):
        common.replay(replay_records(tmp_path / "nightly", now))


def test_a_step_stopped_at_its_count_has_its_tokens_tracked_and_its_seconds_na() -> None:
    from benchmarks import common

    def record(step: str, **fields: Any) -> records.Record:
        return records.Record(run_id="r", session="s@2048", profile="tiny-qwen35", variant=VARIANT, build="b",
                              model="tiny:qwen35", size=2048, scenario="edit_middle", step=step, role="measure",
                              endpoint="/completion", started_at=0.0, ended_at=0.0, **fields)

    cache = common.summarise([record("line at 50%", prompt_n=2066, cache_n=0, prefilled_n=512, ttft_ms=None)],
                             ["records.jsonl"])
    figures = cache["figures"][(VARIANT, "2K", "edit_middle/line at 50%")]
    assert figures["reprocessed_tokens"] == 2066  # the count, as if it had run to its end
    assert all(math.isnan(figures[name]) for name in ("prefill_seconds", "prefill_seconds_min", "prefill_seconds_max",
                                                      "ttft_seconds"))  # n/a in asv, not 0


def test_a_session_whose_server_died_at_start_up_fails_in_replay_as_live(tmp_path: Path) -> None:
    from benchmarks import common

    died = "ServerError: llama-server exited with status 1 before it was healthy"
    _, replayed = common.replay(replay_records(tmp_path / "run", current_stamp(), failures=[died]))
    live = common.summarise(replayed, ["records.jsonl"], failed_sessions=1)
    for cache in (common.summarise(replayed, ["records.jsonl"]), live):
        assert common.figure(cache, "2K", VARIANT, "first_load/cold", "prefill_seconds") == 1.0
        with pytest.raises(SkipNotImplemented):  # the clean session: a step it did not measure does not apply
            common.figure(cache, "2K", VARIANT, "reask/new question", "prefill_seconds")
        with pytest.raises(RuntimeError, match=f"no prefill_seconds for {VARIANT} @ 4K first_load/cold: {died}"):
            common.figure(cache, "4K", VARIANT, "first_load/cold", "prefill_seconds")


def test_a_variant_whose_option_an_older_build_lacks_is_not_applicable(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import common

    profile = profiles.load_profile("tiny-qwen35", check_binary=False)
    names = [v.name for v in profile.variants]
    accepted = binaries.help_options(profile.variants[0].binary)
    monkeypatch.setattr(binaries, "help_options", lambda binary: accepted - {"cache-reuse"})
    skipped = profiles.not_runnable(profile, names)
    assert skipped == {name: "its llama-server has no --cache-reuse" for name in names}  # cache-reuse=0 passes it too
    cache = {**common.summarise([], []), "not_applicable": {"mmproj=on,cache-reuse=256": skipped[names[0]]}}
    with pytest.raises(SkipNotImplemented, match="mmproj=on,cache-reuse=256 does not apply to this build: its "
                                                 "llama-server has no --cache-reuse"):
        common.figure(cache, "2K", "mmproj=on,cache-reuse=256", REASK, "reprocessed_tokens")
    with pytest.raises(RuntimeError, match="no reprocessed_tokens"):  # an applicable variant without figures fails
        common.figure(cache, "2K", VARIANT, REASK, "reprocessed_tokens")


def test_a_variant_whose_model_architecture_a_build_does_not_know_is_not_applicable(tmp_path: Path) -> None:
    """An older llama.cpp lacks the names of later architectures; a GGUF of an architecture that no llama.cpp has
    stands in for a model that arrived after the build."""
    model = tmp_path / "future.gguf"
    writer = gguf.GGUFWriter(str(model), "reusebench-future")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    profile_file = tmp_path / "future.yaml"
    profile_file.write_text(f"description: a model from the future\nbinary: {default_llama_server()}\n"
                            f"model: {model}\n")
    future = profiles.load_profile(profile_file, check_binary=False)
    assert profiles.not_runnable(future, ["default"]) == {
        "default": "its llama-server does not know the model's architecture (reusebench-future)"}
    for name in ("tiny-qwen35", "tiny-nemotron_h", "tiny-granitehybrid", "tiny-glm", "tiny-llama"):
        shipped = profiles.load_profile(name, check_binary=False)  # every tiny model loads on the default build
        assert profiles.not_runnable(shipped, [shipped.variants[0].name]) == {}, name
    wrapper = tmp_path / "llama-server"  # a launcher holds no architecture table: it cannot tell, so it applies
    wrapper.write_text(f"#!/bin/sh\nexec {default_llama_server()} \"$@\"\n")
    wrapper.chmod(0o755)
    assert binaries.knows_architecture(binaries.Binary(path=wrapper), "reusebench-future") is None


# --- the nightly flow ----------------------------------------------------------------------------

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.14)
project(fake_llama NONE)
add_custom_target(llama-server ALL
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/llama-server ${CMAKE_BINARY_DIR}/bin/llama-server)
"""


def launcher(extra_args: str = "") -> str:
    return f'#!/bin/sh\nexec "{default_llama_server()}" "$@" {extra_args}\n'


def fake_llama_cpp(path: Path) -> str:
    """A git repository with one commit, context checkpoints on (llama-server's default). Returns its hash."""
    path.mkdir()
    (path / "CMakeLists.txt").write_text(CMAKELISTS)
    server = path / "llama-server"
    server.write_text(launcher())
    server.chmod(0o755)
    git(path, "init", "-q", "-b", "master")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "checkpoints on")
    return git(path, "rev-parse", "HEAD")


def disable_checkpoints(path: Path) -> str:
    """The stand-in's next commit: context checkpoints off. Returns its hash."""
    (path / "llama-server").write_text(launcher("--ctx-checkpoints 0"))
    git(path, "commit", "-q", "-am", "checkpoints off")
    return git(path, "rev-parse", "HEAD")


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", *args], cwd=path,
                          check=True, capture_output=True, text=True).stdout.strip()


def reusebench(env: dict[str, str], *args: str, status: int = 0, timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "reusebench", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == status, f"reusebench {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def stored(results_dir: Path, commit: str) -> dict[tuple[str, tuple[str, ...]], Any]:
    """What asv stored for `commit` on the test's machine."""
    figures = asv_results.stored(results_dir, commit, MACHINE)
    assert figures, f"no results for {commit} in {results_dir / MACHINE}"
    return figures


@pytest.mark.e2e
def test_two_nightlies_measure_one_new_commit_each_and_compare_flags_the_regression(tmp_path: Path) -> None:
    repo, nights = tmp_path / "llama.cpp", tmp_path / "nightly"
    first = fake_llama_cpp(repo)
    env = asv_env(tmp_path, REUSEBENCH_ASV_SCENARIOS="reask after_sleep")
    night = ("nightly", "--repo", str(repo), "--results", str(nights), "--machine", MACHINE)
    planned = reusebench(env, *night).splitlines()  # the plan comes first, on stdout
    assert planned[0].startswith("nightly plan: 1 commit(s)") and planned[1].split()[0] == first[:12]
    # Between the two nights: checkpoints off, then a commit that changes nothing; the night measures the newest
    # alone (--max-commits 1), finds the re-ask's count changed since the last night, and bisects the three
    # commits to the one that changed it.
    off = disable_checkpoints(repo)
    (repo / "README").write_text("a change that changes no count\n")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "docs : a readme")
    second = git(repo, "rev-parse", "HEAD")
    planned = reusebench(env, *night, "--max-commits", "1").splitlines()  # only the newest commit not measured
    assert planned[0].startswith("nightly plan: 1 commit(s)") and planned[1].split()[0] == second[:12]
    assert planned[-1].startswith("time: about ")  # timed by the first night
    found = json.loads((nights / "nightly.jsonl").read_text().splitlines()[-1])["first_changes"]
    reask_tokens = next(c for c in found if (c["step"], c["kind"]) == (REASK, "tokens"))
    assert (reask_tokens["last_held"], reask_tokens["first_changed"]) == (first[:10], off[:10])
    assert reask_tokens["commits"] == [f"{off[:7]} checkpoints off"] and reask_tokens["branch"] == "master"
    assert reask_tokens["held_value"] <= 600 and reask_tokens["changed_value"] >= 2048
    page = (nights / "html" / "first-changes.html").read_text()
    assert f"<td>{off[:10]}</td>" in page and "checkpoints off" in page

    before, after = stored(nights / "asv", first), stored(nights / "asv", second)
    sized = ("'2K'", repr(VARIANT))
    reask = (*sized, repr(REASK))
    for figures in (before, after):
        assert figures[("reuse.FirstLoad.track_prefill_seconds", sized)] > 0
        assert figures[("reuse.StepSeconds.track_ttft_seconds", reask)] > 0
        assert figures[("correctness.ReusedOutputMismatch.track_mismatch", reask)] == 0
    # Checkpoints on: the re-ask resumes 4 + ubatch tokens before the end. Off: the whole prompt.
    assert before[("reuse.ReprocessedTokens.track_reprocessed_tokens", reask)] <= 600
    assert after[("reuse.ReprocessedTokens.track_reprocessed_tokens", reask)] >= 2048
    assert after[("reuse.ReprocessedTokens.track_excess_over_ideal", reask)] >= 2000
    # The option check sees the same change: checkpoints set to 32 in the profile, then disabled by the build.
    checkpoints = (repr(VARIANT), "'ctx-checkpoints'")
    assert before[("verdicts.OptionVerdict.track_verdict_code", checkpoints)] == 1  # ACTIVE
    assert after[("verdicts.OptionVerdict.track_verdict_code", checkpoints)] != 1
    # The reuse model expects the checkpoint at 4 + ubatch tokens before the end on both commits: the second
    # commit's re-ask deviates by everything but those tokens, and its record says UNEXPECTED.
    deviation = ("reuse.ExpectedTokens.track_deviation_from_expected", reask)
    assert before[deviation] == 0 and after[deviation] >= 2048 - 600
    runs = sorted((tmp_path / "records" / "runs").glob("*/records.jsonl"))
    assert len(runs) == 2
    reasks = [next(r for r in records.read_records(run) if r.role == records.Role.MEASURE and f"{r.scenario}/{r.step}" == REASK)
              for run in runs]
    assert [r.verdict for r in reasks] == ["partial", "UNEXPECTED"]
    assert reasks[1].expected == reasks[0].expected == reasks[0].prompt_n <= 600  # "expected 515"
    assert reasks[1].prompt_n == reasks[1].prompt_tokens  # "measured: the whole prompt"
    assert reasks[1].cause["forced_full"] and reasks[1].cause_expected.startswith("restored checkpoint at")
    # A scenario that does not apply to the variant (no sleep-idle-seconds) is n/a, not a failure.
    assert math.isnan(after[("reuse.ReprocessedTokens.track_reprocessed_tokens", (*sized, repr(AFTER_SLEEP)))])
    # Every binary came from the build cache `reusebench build` keeps per commit: the nights' two, the bisect's third.
    assert {p.name.split("-")[0] for p in (tmp_path / "builds").glob("*-*")} == {first[:12], off[:12], second[:12]}

    # Checkpoints off re-processes the whole prompt at the re-ask: a count, so the noise rule flags any change.
    compared = reusebench(env, "compare", first, second, "--results", str(nights), "--json", status=1)
    regressions = {(c["benchmark"], tuple(c["params"])) for c in json.loads(compared) if c["kind"] == "regression"}
    assert ("reuse.ReprocessedTokens.track_reprocessed_tokens", ("2K", VARIANT, REASK)) in regressions
    assert ("verdicts.OptionVerdict.track_verdict_code", (VARIANT, "ctx-checkpoints")) in regressions
    assert reusebench(env, "compare", first, first, "--results", str(nights)).strip() == (
        f"{first[:12]} -> {first[:12]}: no figure changed beyond the noise rule")

    graphs = list((nights / "html" / "graphs").rglob("reuse.ReprocessedTokens.track_reprocessed_tokens.json"))
    assert graphs and (nights / "html" / "index.html").is_file()
    logged = [json.loads(line) for line in (nights / "nightly.jsonl").read_text().splitlines()]
    assert [n["commits"] for n in logged] == [[first], [second]] and [n["asv_run_status"] for n in logged] == [0, 0]
