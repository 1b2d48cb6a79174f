"""Images a document carries: generated from a seed (every run sends the same bytes) or read from files.

An image is content, as text is: its bytes go to the server and nowhere else. Records, reports and pages see its
digest, its size in pixels and where it sits in the prompt.

A document's text holds a placeholder where each image goes (``placeholder``); the requests turn it into the
server's media marker (``/completion``'s ``multimodal_data``) or an ``image_url`` part (chat), and count the image
as a run of ids of its own (``reuse.image_runs``) wherever a prompt is compared token by token: one image matches another
whole or not at all, as the server matches its chunks by the image's id.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# what llama.cpp's stb_image decodes (tools/mtmd/mtmd-helper.cpp), by the names Pillow gives the formats
READABLE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "PPM", "TGA", "PSD")
MAX_PIXELS = 64 * 1024 * 1024  # one image decoded is 3 bytes a pixel in the server, per request: a sane cap
MAX_FILE_BYTES = 64 * 1024 * 1024
PLACEHOLDER = re.compile(r"<\|reusebench-image-(\d+)\|>")


class ImageError(ValueError):
    """An image file the server could not take, named with why."""


@dataclass(frozen=True)
class Image:
    """One image: its bytes (sent, never written), and what may be written about it."""

    data: bytes
    width: int
    height: int
    format: str  # "PNG", "JPEG", ...

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()[:16]

    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:image/{self.format.lower()};base64,{self.base64()}"

    def describe(self) -> dict[str, object]:
        """What a record may keep of the image."""
        return {"digest": self.digest, "width": self.width, "height": self.height, "bytes": len(self.data)}


def generated(seed: int, index: int, side: int) -> Image:
    """A `side` x `side` PNG of seeded noise: the same bytes for the same seed and index on every machine."""
    from PIL import Image as PILImage  # Pillow is needed only where images are

    pixels = np.random.default_rng([seed, index]).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    PILImage.fromarray(pixels, "RGB").save(out, format="PNG", compress_level=6)
    return Image(out.getvalue(), side, side, "PNG")


def read_file(path: Path, *, where: str) -> Image:
    """An image file as the server would decode it; `where` names the field that gave the path."""
    if not path.is_file():
        raise ImageError(f"{where}: image file not found: {path}")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ImageError(f"{where}: {path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} an image may have")
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    data = path.read_bytes()
    try:
        with PILImage.open(io.BytesIO(data)) as image:
            image_format, (width, height) = str(image.format), image.size
            if width * height > MAX_PIXELS:
                raise ImageError(f"{where}: {path}: {width}x{height} pixels, more than the {MAX_PIXELS:,} an image "
                                 "may have (the projector resizes it anyway: scale it down)")
            image.load()  # a truncated file fails here, as it would in the server
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ImageError(f"{where}: {path}: not an image file ({type(exc).__name__})") from exc
    if image_format not in READABLE_FORMATS:
        raise ImageError(f"{where}: {path}: a {image_format} image, which llama.cpp does not decode; "
                         f"use one of {', '.join(READABLE_FORMATS)}")
    return Image(data, width, height, image_format)


def placeholder(index: int) -> str:
    return f"<|reusebench-image-{index}|>"


def place(text: str, at: Sequence[float], first_index: int) -> str:
    """`text` with placeholders ``first_index``, ``first_index + 1``, ... at the word breaks nearest each fraction of
    its length (in order), so the text around an image tokenizes as it did without it."""
    cuts = []
    for fraction in at:
        target = int(len(text) * fraction)
        before = max(text.rfind(" ", 0, target + 1), text.rfind("\n", 0, target + 1))
        cuts.append(before if before >= 0 else target)
    pieces, last = [], 0
    for k, cut in enumerate(cuts):
        pieces += [text[last:cut], placeholder(first_index + k)]
        last = cut
    return "".join([*pieces, text[last:]])


def split(text: str) -> list[str | int]:
    """`text` as its pieces of text and image indices, in order (empty texts left out)."""
    parts: list[str | int] = []
    last = 0
    for match in PLACEHOLDER.finditer(text):
        if match.start() > last:
            parts.append(text[last:match.start()])
        parts.append(int(match.group(1)))
        last = match.end()
    if last < len(text):
        parts.append(text[last:])
    return parts


def has_images(text: str) -> bool:
    return PLACEHOLDER.search(text) is not None
