"""An image as llama-server takes it: its bytes (generated from a seed, or read from a file the way the server would
decode it), its size, and how a request carries it (base64, a data URL).

An image is content, as text is: its bytes go to the server and nowhere else; records, reports and pages see its
digest and its size (``describe``).
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# what llama.cpp's stb_image decodes (tools/mtmd/mtmd-helper.cpp), by the names Pillow gives the formats
READABLE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "PPM", "TGA", "PSD")
MAX_PIXELS = 64 * 1024 * 1024  # one image decoded is 3 bytes a pixel in the server, per request: a sane cap
MAX_FILE_BYTES = 64 * 1024 * 1024


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
