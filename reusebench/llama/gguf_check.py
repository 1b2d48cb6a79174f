"""Check that a GGUF file is complete before a server is started on it.

llama-server reports a corrupt or truncated model only in its log, and it can
exit before that line is written; reading the header and tensor table here gives
an error that names the file instead.
"""

from __future__ import annotations

from pathlib import Path

import gguf


class GgufError(ValueError):
    """The file is not a complete GGUF file."""


def architecture(path: Path) -> str:
    """The model's ``general.architecture``, e.g. "qwen35"."""
    field = gguf.GGUFReader(path).get_field("general.architecture")
    if field is None:
        raise GgufError(f"{path}: no general.architecture")
    return field.contents()


def check_gguf(path: Path) -> None:
    """Raise GgufError unless ``path`` has a valid header and every tensor's data lies inside the file."""
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError) as exc:
        raise GgufError(f"{path}: not a readable GGUF file (corrupt or truncated: {exc})") from exc
    size = path.stat().st_size
    end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise GgufError(f"{path}: truncated GGUF file: tensor data ends at byte {end:,}, file has {size:,}")
