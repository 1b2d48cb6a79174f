"""Report A's steps with images, on the real llama-server with a generated hybrid and its mmproj: every step sends
the document's two images (corpora/tiny-words-images.yaml: at 25% and 75%), through /completion and, for the growth
chat, as image_url parts. Each count is the reuse model's, and the images the server's log shows encoded are exactly
those after what the step kept."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from PIL import Image as PILImage

from reusebench import cli
from reusebench.cli.exits import Exit
from reusebench.config import profiles
from reusebench.records import Record, Role, images_reprocessed
from reusebench.report import view
from reusebench.run import runner
from reusebench.run.selection import Selection

pytestmark = pytest.mark.e2e

SIZE = 2048
STEPS = ("first_load", "resend", "interleave", "reask", "edit_middle", "growth", "restore_disk")


def run_with_images(profile: str, variant: str, results: Path) -> list[Record]:
    result = runner.run_profile(profiles.load_profile(profile),
                                Selection((variant,), (SIZE,), STEPS, corpus_name="tiny-words-images"),
                                results_dir=results, out=io.StringIO())
    assert result.failed_sessions == 0
    return [r for r in result.records if r.role == Role.MEASURE]


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Record]:
    measured = run_with_images("tiny-qwen35", "mmproj=on,cache-reuse=256", tmp_path_factory.mktemp("results"))
    return {(r.scenario, r.step): r for r in measured}


def images_after_kept(r: Record) -> int:
    return len(images_reprocessed(r))


def test_every_step_with_images_re_processes_what_the_reuse_model_expects(qwen35):
    assert set(qwen35) == {("first_load", "cold"), ("resend", "same prompt"), ("interleave", "back to first"),
                           ("reask", "new question"), ("edit_middle", "line at 50%"),
                           *(("growth", f"turn {k}") for k in range(1, 5)),
                           ("restore_disk", "resend"), ("restore_disk", "reask")}  # no extension: token ids
    for r in qwen35.values():
        assert r.extra["images_sent"] == 2 and r.prompt_n == r.expected, (r.scenario, r.step)


def test_the_server_encodes_the_images_after_what_a_step_kept_and_no_other(qwen35):
    for r in qwen35.values():
        assert r.cause is not None and r.cause["images_encoded"] == images_after_kept(r), (r.scenario, r.step)
    assert qwen35[("first_load", "cold")].cause["images_encoded"] == 2
    # the resend returns to the checkpoint 4 tokens before the end, after both images: none encoded again
    assert (qwen35[("resend", "same prompt")].prompt_n, images_after_kept(qwen35[("resend", "same prompt")])) == (4, 0)
    # the edit at 50% lies between the images, and a hybrid has no checkpoint before it: both encoded again
    assert qwen35[("edit_middle", "line at 50%")].cause["images_encoded"] == 2
    # a chat whose first message carries the images: the later turns keep them
    assert [qwen35[("growth", f"turn {k}")].cause["images_encoded"] for k in range(1, 5)] == [2, 0, 0, 0]


def test_reused_outputs_with_images_equal_outputs_without_reuse(qwen35):
    reused = [r for r in qwen35.values() if r.cache_n]
    assert len(reused) >= 5 and all(r.matches_reference is True for r in reused)


def test_a_corpus_with_images_on_a_variant_without_an_mmproj_is_refused_naming_both(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = cli.main(["run", "--profile", "tiny-qwen35", "--variant", "mmproj=off,cache-reuse=0", "--size", "2K",
                       "--corpus", "tiny-words-images", "--dry-run", "--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == Exit.CONFIG
    assert "tiny-words-images.yaml: images: the corpus's documents carry images" in err
    assert "tiny-qwen35 [mmproj=off,cache-reuse=0] loads no mmproj" in err


def test_a_corpus_of_the_user_s_own_image_files_is_sent_as_they_are(tmp_path: Path) -> None:
    # a 40x24 JPEG and a 300x200 PNG: the projector resizes both to its 32 px, so each takes its 16 tokens
    PILImage.new("RGB", (40, 24), (200, 10, 10)).save(tmp_path / "scan.jpg", format="JPEG")
    PILImage.new("RGB", (300, 200), (10, 10, 200)).save(tmp_path / "chart.png")
    spec = tmp_path / "mine.yaml"
    spec.write_text("source: words\nseed: 3\nquestions: [' what is shown', ' which color']\nedit: ' an edit'\n"
                    "summary: ' a summary'\nimages:\n  at: [0.1, 0.9]\n  files: [scan.jpg, chart.png]\n")
    result = runner.run_profile(profiles.load_profile("tiny-qwen35"),
                                Selection(("mmproj=on,cache-reuse=0",), (SIZE,), ("first_load", "resend"),
                                          corpus_name=str(spec)), results_dir=tmp_path / "results", out=io.StringIO())
    cold, resend = [r for r in result.records if r.role == Role.MEASURE]
    assert [length for _, length in cold.extra["image_spans"]] == [16, 16]
    assert (cold.cause or {})["images_encoded"] == 2 and (resend.cause or {})["images_encoded"] == 0
    assert (cold.prompt_n, resend.prompt_n) == (cold.expected, resend.expected)
    page = view.write_run_page(result.run_dir).read_text()  # the run's page has an images column
    assert "<th>images</th>" in page and "2 / 2 re-processed (32 tokens); encoded 2 in " in page
    # images are content: nothing the run kept holds an image, its base64 or where the prompt text put it
    kept = b"".join(p.read_bytes() for p in (tmp_path / "results").rglob("*") if p.is_file())
    for image in ("scan.jpg", "chart.png"):
        data = (tmp_path / image).read_bytes()
        assert data[16:48] not in kept and base64.b64encode(data)[:40] not in kept
    assert b"data:image" not in kept and b"reusebench-image" not in kept and b"reusebench_media" not in kept


def test_asv_tracks_the_images_each_step_re_processed_and_encoded(qwen35):
    from benchmarks import common

    figures = common.summarise(list(qwen35.values()), ["records.jsonl"])["figures"]
    variant = "mmproj=on,cache-reuse=256"
    cold, resend = figures[(variant, "2K", "first_load/cold")], figures[(variant, "2K", "resend/same prompt")]
    assert (cold["images_encoded"], cold["image_tokens_reprocessed"]) == (2, 32)  # two images of 16 tokens
    assert (resend["images_encoded"], resend["image_tokens_reprocessed"], resend["image_encode_seconds"]) == (0, 0, 0)
    assert cold["image_encode_seconds"] > 0


@pytest.mark.parametrize("family", ["nemotron_h", "gemma3"])
def test_another_hybrid_and_a_windowed_model_keep_their_images_as_the_model_expects(tmp_path: Path,
                                                                                   family: str) -> None:
    # Mamba2 layers (no multi-position RoPE) and a 128-token sliding window, each with the generated projector
    profile = tmp_path / f"{family}.yaml"
    profile.write_text(f"extends: tiny-base\nmodel: tiny:{family}\nmmproj: tiny:{family}\n")
    measured = run_with_images(str(profile), "default", tmp_path / "results")
    assert len(measured) == 11  # five steps, four chat turns, and the resend and re-ask after a restore
    for r in measured:
        assert r.prompt_n == r.expected and (r.cause or {})["images_encoded"] == images_after_kept(r), r.step
        assert r.matches_reference is not False, r.step


def test_the_real_gemma_with_a_generated_projector_keeps_its_images_as_the_model_expects(tmp_path: Path) -> None:
    # real weights (Gemma 3 270M ships no projector: `tiny:projector` makes one 640 wide), its 512-token window, and
    # prose with two images: the counts are the model's, and a reused output is the same as without reuse or
    # within the noise a change of batch size alone makes
    profile = tmp_path / "gemma-images.yaml"
    profile.write_text("extends: gemma3-270m\nmmproj: tiny:projector\ncorpus: python-docs-images\n")
    result = runner.run_profile(profiles.load_profile(str(profile)),
                                Selection(sizes=(SIZE,), scenario_ids=("first_load", "resend", "reask")),
                                results_dir=tmp_path / "results", out=io.StringIO())
    measured = [r for r in result.records if r.role == Role.MEASURE]
    assert [(r.step, r.prompt_n == r.expected) for r in measured] == [
        ("cold", True), ("same prompt", True), ("new question", True)]
    assert [(r.cause or {})["images_encoded"] for r in measured] == [2, 0, 0]
    assert all(r.extra["output_check"] in ("identical", "within noise") for r in measured[1:])
