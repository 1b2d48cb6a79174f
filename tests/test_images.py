"""Images in documents, without a server: generated ones are the same bytes every time, a bad image file is an error
naming it and why, a corpus spec places its images where it says, and an image counts as a run of ids of its own."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image as PILImage

from reusebench.config import corpus, images
from reusebench.llama import media
from reusebench.records import Record
from reusebench.report import run_report
from reusebench.reuse import image_runs
from reusebench.reuse.segments import common_prefix


def test_a_generated_image_is_the_same_png_for_the_same_seed_and_index() -> None:
    first, again, other = media.generated(7, 0, 32), media.generated(7, 0, 32), media.generated(7, 1, 32)
    assert first.data == again.data and first.digest == again.digest
    assert other.digest != first.digest
    with PILImage.open(io.BytesIO(first.data)) as decoded:
        assert (decoded.format, decoded.size) == ("PNG", (32, 32))


def test_what_a_record_may_keep_of_an_image_is_its_digest_and_sizes_never_its_bytes() -> None:
    image = media.generated(7, 0, 32)
    assert image.describe() == {"digest": image.digest, "width": 32, "height": 32, "bytes": len(image.data)}


@pytest.mark.parametrize(("content", "why"), [
    (b"plain text, not an image\n", "not an image file"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 20, "not an image file"),  # a PNG header with nothing after it
])
def test_a_file_that_is_not_an_image_is_an_error_naming_the_file(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "figure.png"
    path.write_bytes(content)
    with pytest.raises(media.ImageError, match=rf"images.files: .*figure\.png: {why}"):
        media.read_file(path, where="images.files")


def test_an_image_llama_cpp_does_not_decode_is_an_error_naming_the_format(tmp_path: Path) -> None:
    path = tmp_path / "figure.webp"
    PILImage.new("RGB", (8, 8)).save(path, format="WEBP")
    with pytest.raises(media.ImageError, match=r"figure\.webp: a WEBP image, which llama\.cpp does not decode"):
        media.read_file(path, where="images.files")


def test_an_image_of_more_pixels_than_the_cap_is_refused_before_it_is_decoded(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.png"
    PILImage.new("RGB", (64, 64)).save(path)
    monkeypatch.setattr(media, "MAX_PIXELS", 64 * 64 - 1)
    with pytest.raises(media.ImageError, match=r"big\.png: 64x64 pixels, more than the 4,095"):
        media.read_file(path, where="images.files")


def test_a_jpeg_file_is_read_with_its_size(tmp_path: Path) -> None:
    path = tmp_path / "scan.jpg"
    PILImage.new("RGB", (40, 24), (200, 10, 10)).save(path, format="JPEG")
    image = media.read_file(path, where="images.files")
    assert (image.format, image.width, image.height, image.data) == ("JPEG", 40, 24, path.read_bytes())


def test_images_go_at_the_word_break_before_each_fraction() -> None:
    text = " a b c d e f g h"  # 16 characters; 0.5 -> character 8, the break before " e"
    placed = images.place(text, [0.0, 0.5], 3)
    assert placed == "<|reusebench-image-3|> a b c d<|reusebench-image-4|> e f g h"
    assert images.split(placed) == [3, " a b c d", 4, " e f g h"]


def spec(tmp_path: Path, images_yaml: str) -> Path:
    path = tmp_path / "with-images.yaml"
    path.write_text("source: words\nquestions: [' what is it', ' which one']\nedit: ' an edit'\nsummary: ' a summary'\n"
                    + images_yaml)
    return path


def test_a_corpus_spec_gives_generated_images_of_its_size(tmp_path: Path) -> None:
    loaded = corpus.load_spec(spec(tmp_path, "images:\n  at: [0.25, 0.75]\n  size: 16\n"))
    assert loaded.images == corpus.ImageSpec((0.25, 0.75), 16)


@pytest.mark.parametrize(("images_yaml", "message"), [
    ("images: 2\n", r"images: must be a mapping"),
    ("images:\n  at: [0.75, 0.25]\n", r"images: `at` must be a list of fractions from 0 to 1, in order"),
    ("images:\n  at: [0.5]\n  size: 0\n", r"images: `size` must be the side"),
    ("images:\n  at: [0.5]\n  where: 3\n", r"images: unknown field 'where'"),
    ("images:\n  at: [0.2, 0.8]\n  files: [a.png]\n", r"images: `files` must be a list of 2 paths"),
    ("images:\n  at: [0.5]\n  files: [missing.png]\n", r"images.files: image file not found: .*missing\.png"),
])
def test_a_bad_images_field_names_the_file_and_the_field(tmp_path: Path, images_yaml: str, message: str) -> None:
    path = spec(tmp_path, images_yaml)
    with pytest.raises(corpus.CorpusError, match=rf"{path.name}.*{message}"):
        corpus.load_spec(path)


def test_a_corpus_image_file_that_is_not_an_image_fails_when_the_spec_is_read(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(corpus.CorpusError, match=r"with-images\.yaml: images\.files: .*notes\.png: not an image"):
        corpus.load_spec(spec(tmp_path, "images:\n  at: [0.5]\n  files: [notes.png]\n"))


def test_two_images_share_no_id_and_one_image_matches_itself_whole() -> None:
    # prompt = BOS, 3 text ids, image 0 (4 ids), 2 text ids; the same with image 1 in its place
    with_0 = [1, 5, 6, 7, *image_runs.run_ids(0, 4), 8, 9]
    with_1 = [1, 5, 6, 7, *image_runs.run_ids(1, 4), 8, 9]
    assert common_prefix(with_0, with_1) == 4  # up to the image, never into it
    assert common_prefix(with_0, list(with_0)) == 10
    assert image_runs.spans(with_0) == ((4, 4),)
    # two images side by side are two runs
    assert image_runs.spans([*image_runs.run_ids(2, 3), *image_runs.run_ids(5, 2), 4]) == ((0, 3), (3, 2))


def test_a_step_stopped_at_its_count_shows_its_images_to_re_process_and_no_encode() -> None:
    # two 16-token images at 100 and 300; the step kept 200 tokens: the second is re-processed whole. Stopped at its
    # first progress event, the server never reached it: not "0 encoded" but "-"
    def step(**fields: object) -> Record:
        return Record(run_id="r", session="s@2048", profile="p", variant="v", build="b", model="m", size=2048,
                      scenario="edit_middle", step="line at 50%", role="measure", endpoint="/completion",
                      started_at=0.0, ended_at=0.0, cache_n=200, extra={"image_spans": [[100, 16], [300, 16]]},
                      **fields)  # type: ignore[arg-type]

    assert run_report.image_cells(step(prompt_ms=None)) == ["1 / 2", "16", "-", "-"]
    ran = step(prompt_ms=9.0, cause={"images_encoded": 1, "image_encode_ms": 2.0})
    assert run_report.image_cells(ran) == ["1 / 2", "16", "1", "0.002"]
