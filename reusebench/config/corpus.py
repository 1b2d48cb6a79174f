"""Documents of an exact token size, measured with the server's own tokenizer.

A corpus spec (``corpora/*.yaml``) names a text source and the short texts a
session needs: two questions that differ from their first token on (so a re-ask
must go back to the ``4 + n_ubatch`` checkpoint, as in report A), a one-line
edit inserted at 50%, and a summary for the head-insert case. Sources:

- ``words``: seeded words from the tiny models' vocabulary (one token per word);
- ``stdlib``: this Python's standard-library sources, concatenated in sorted order;
- ``python-docs``: English prose that every Python carries, its language reference
  (``pydoc_data.topics``, about 100K tokens), topic by topic;
- ``file``: any UTF-8 text file (``path:``).

A spec may give the documents images (``images:``): ``at``, the fractions of the text where one goes each (at the
word break before), and either ``size`` (generated seeded images of that many pixels a side, 32 unless given) or
``files`` (image files, one per position, relative to the spec). The other document carries images of its own at the
same places. A document's ``size`` counts its text; its images come on top.

``python-docs`` and ``file`` are never repeated: a text with fewer tokens than the
requested size is an error that names it and both sizes (a repeated text would let a
cache match the document against itself).

Sizing takes a handful of tokenizer calls, never one per word: estimate the
characters per token on a sample, cut, tokenize, then cut exactly at the wanted
token with one detokenize.
"""

from __future__ import annotations

import math
import random
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reusebench import reader, tiny
from reusebench.config import images as images_mod
from reusebench.llama import media

MAX_TOKENIZER_CALLS = 5
SPEC_KEYS = {"description", "source", "seed", "path", "questions", "edit", "summary", "images"}
IMAGE_KEYS = {"at", "size", "files"}
IMAGE_SIDE = 32  # the tiny projector's own input size (tiny.shapes): a generated image is not resized
SOURCES = ("words", "stdlib", "python-docs", "file")
CORPORA_DIR = Path(__file__).resolve().parents[2] / "corpora"


class CorpusError(ValueError):
    """A corpus spec or source that cannot give the requested documents."""


@dataclass(frozen=True)
class ImageSpec:
    """Where a document's images go and what they are: generated (`side` pixels) or `files`."""

    at: tuple[float, ...]
    side: int = IMAGE_SIDE
    files: tuple[Path, ...] = ()

    def images(self, seed: int, variant: int, where: str) -> list[media.Image]:
        """The images of document `variant` (0: the document, 1: the other), in the order they appear."""
        if self.files:
            # the other document shows the same files mirrored in order, so it differs from the first where it can
            files = self.files if variant == 0 else tuple(reversed(self.files))
            return [media.read_file(f, where=f"{where}: images.files") for f in files]
        return [media.generated(seed, variant * len(self.at) + k, self.side) for k in range(len(self.at))]


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    path: Path
    source: str
    seed: int
    questions: tuple[str, str]
    edit: str
    summary: str
    file: Path | None = None
    images: ImageSpec | None = None


@dataclass(frozen=True)
class Corpus:
    """The texts of one session at one size. Text stays in memory; records see lengths and hashes."""

    spec: CorpusSpec
    size: int
    document: str
    other: str
    edited: str
    tokenizer_calls: int
    images: tuple[media.Image, ...] = ()  # by their placeholders' numbers: the document's, then the other's

    @property
    def questions(self) -> tuple[str, str]:
        return self.spec.questions

    @staticmethod
    def prompt(document: str, question: str) -> str:
        return f"{document}\n{question}"


class Tokenizer(Protocol):
    """The two tokenizer calls corpus building needs; LlamaClient has them."""

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...


def load_spec(name_or_path: str | Path, corpora_dir: Path = CORPORA_DIR) -> CorpusSpec:
    """Read and check a corpus spec given by name (in `corpora_dir`) or by path; ``${ENV}`` in its texts expands."""
    path = reader.find(name_or_path, corpora_dir, CorpusError, "corpus")
    doc = reader.read(path, CorpusError, "corpus")

    def fail(key: str, why: str) -> CorpusError:
        return CorpusError(f"{doc.at(key)}: {key}: {why}")

    data = {key: reader.expand_env(value, source=doc.at(key), field_name=key, error=CorpusError)
            if isinstance(value, str) else value for key, value in doc.data.items()}
    for key in data:
        if key not in SPEC_KEYS:
            raise fail(str(key), f"unknown field{reader.did_you_mean(str(key), SPEC_KEYS)}; "
                                 f"valid fields: {', '.join(sorted(SPEC_KEYS))}")
    source = data.get("source")
    if source not in SOURCES:
        raise fail("source", f"must be one of {', '.join(SOURCES)}, got {source!r}")
    questions = data.get("questions")
    if not (isinstance(questions, list) and len(questions) == 2 and all(isinstance(q, str) and q for q in questions)):
        raise fail("questions", "must be a list of two non-empty strings")
    if questions[0].split()[0] == questions[1].split()[0]:
        raise fail("questions", "must differ from their first word on (a re-ask must diverge early)")
    for key in ("edit", "summary"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise fail(key, "must be a non-empty string")
    file = None
    if source == "file":
        if not isinstance(data.get("path"), str):
            raise fail("path", "required for source 'file'")
        file = (path.parent / data["path"]).resolve()
        if not file.is_file():
            raise fail("path", f"file not found: {file}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise fail("seed", "must be an integer")
    image_spec = _image_spec(data["images"], path, fail) if "images" in data else None
    return CorpusSpec(
        name=path.stem,
        path=path,
        source=source,
        seed=seed,
        questions=(questions[0], questions[1]),
        edit=data["edit"],
        summary=data["summary"],
        file=file,
        images=image_spec,
    )


def _image_spec(images: object, spec_path: Path, fail: Callable[[str, str], CorpusError]) -> ImageSpec:
    if not isinstance(images, dict):
        raise fail("images", "must be a mapping with `at` and `size` or `files`")
    for key in images:
        if key not in IMAGE_KEYS:
            raise fail("images", f"unknown field {key!r}; valid fields: {', '.join(sorted(IMAGE_KEYS))}")
    at = images.get("at")
    if not (isinstance(at, list) and at and all(isinstance(f, (int, float)) and 0 <= f <= 1 for f in at)
            and list(at) == sorted(at)):
        raise fail("images", "`at` must be a list of fractions from 0 to 1, in order (where each image goes)")
    if "files" in images:
        files = images["files"]
        if "size" in images:
            raise fail("images", "give `size` (generated images) or `files`, not both")
        if not (isinstance(files, list) and len(files) == len(at) and all(isinstance(f, str) for f in files)):
            raise fail("images", f"`files` must be a list of {len(at)} paths, one per position in `at`")
        paths = tuple((spec_path.parent / f).resolve() for f in files)
        for file in paths:  # read now: a bad file fails before any server starts
            try:
                media.read_file(file, where=f"{spec_path}: images.files")
            except media.ImageError as exc:
                raise CorpusError(str(exc)) from exc
        return ImageSpec(tuple(float(f) for f in at), files=paths)
    side = images.get("size", IMAGE_SIDE)
    if not (isinstance(side, int) and 1 <= side <= 4096):
        raise fail("images", "`size` must be the side of the generated images in pixels, 1 to 4096")
    return ImageSpec(tuple(float(f) for f in at), side)


def source_text(spec: CorpusSpec, variant: int, n_chars: int) -> str:
    """At least ``n_chars`` characters of the spec's source; ``variant`` 1 gives a different document."""
    if spec.source == "words":
        return _words(spec.seed + variant, n_chars)
    if spec.source == "stdlib":
        return _repeat(_stdlib_text(reverse=variant == 1), n_chars)
    if spec.source == "python-docs":
        return _python_docs_text(reverse=variant == 1)
    return _file_text(spec, variant)


def _file_text(spec: CorpusSpec, variant: int) -> str:
    assert spec.file is not None
    text = spec.file.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise CorpusError(f"{spec.path}: path: {spec.file} is empty")
    return "\n".join(reversed(text.splitlines())) if variant == 1 else text


def _words(seed: int, n_chars: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    length = 0
    while length < n_chars:
        line = " " + " ".join(rng.choice(tiny.WORDS) for _ in range(rng.randint(8, 16)))
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)


def _stdlib_text(*, reverse: bool) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"), reverse=reverse)
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def _python_docs_text(*, reverse: bool) -> str:
    from pydoc_data.topics import topics  # the text `help()` shows: 0.5 MB, read only for this source

    return "\n\n".join(topics[name] for name in sorted(topics, reverse=reverse))


def _repeat(text: str, n_chars: int) -> str:
    if not text.strip():
        raise CorpusError("the corpus source is empty")
    return (text + "\n") * math.ceil(n_chars / (len(text) + 1))


def exact_document(spec: CorpusSpec, tokenizer: Tokenizer, size: int, *, variant: int = 0) -> tuple[str, int]:
    """A document of ``size`` tokens (±0.5%), and the number of tokenizer calls it took."""
    calls = 0
    sample = source_text(spec, variant, 4096)[:4096]
    calls += 1
    chars_per_token = len(sample) / max(1, len(tokenizer.tokenize(sample)))
    want_chars = int(size * chars_per_token * 1.05) + 64
    while True:
        source = source_text(spec, variant, want_chars)
        text = source[:want_chars]
        calls += 1
        tokens = tokenizer.tokenize(text)
        if len(tokens) >= size:
            break
        if spec.source in ("file", "python-docs") and len(text) == len(source):  # the whole text, still too short
            what = f"path: corpus file {spec.file}" if spec.source == "file" else "source: python-docs"
            raise CorpusError(f"{spec.path}: {what} has {len(tokens):,} tokens, fewer than the requested size of "
                              f"{size:,} (use a longer text or a smaller size)")
        if calls >= MAX_TOKENIZER_CALLS - 1:
            raise CorpusError(f"{spec.path}: could not reach {size} tokens in {calls} tokenizer calls")
        want_chars = int(want_chars * size / max(1, len(tokens)) * 1.05) + 64
    calls += 1
    document = tokenizer.detokenize(tokens[:size])
    return document, calls


def build_corpus(spec: CorpusSpec, tokenizer: Tokenizer, size: int) -> Corpus:
    document, calls_main = exact_document(spec, tokenizer, size, variant=0)
    other, calls_other = exact_document(spec, tokenizer, size, variant=1)
    images: list[media.Image] = []
    if spec.images is not None:
        try:
            mine, others = (spec.images.images(spec.seed, variant, str(spec.path)) for variant in (0, 1))
        except media.ImageError as exc:
            raise CorpusError(str(exc)) from exc
        document = images_mod.place(document, spec.images.at, 0)
        other = images_mod.place(other, spec.images.at, len(mine))
        images = [*mine, *others]
    return Corpus(
        spec=spec,
        size=size,
        document=document,
        other=other,
        edited=insert_line(document, spec.edit, 0.5),
        tokenizer_calls=calls_main + calls_other,
        images=tuple(images),
    )


def insert_line(document: str, line: str, fraction: float) -> str:
    """Insert ``line`` as its own line at the line break nearest ``fraction`` of the document."""
    target = int(len(document) * fraction)
    before = document.rfind("\n", 0, target)
    after = document.find("\n", target)
    candidates = [i for i in (before, after) if i >= 0]
    cut = min(candidates, key=lambda i: abs(i - target)) if candidates else target
    return f"{document[:cut]}\n{line}{document[cut:]}"
