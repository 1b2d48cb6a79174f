"""The tap's secret key: its records hold keyed hashes (HMAC-SHA256) of prompts and outputs, never the ids.

An unkeyed hash of a prompt lets anyone who guesses a text confirm it; a keyed one only lets the key's holder.
The key lives outside the results (default ``~/.config/reusebench/tap.key``, mode 0600, made on first use), so
results can be shared while the key is not: the same key across runs makes a prompt's hash comparable between
them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np

KEY_ENV = "REUSEBENCH_TAP_KEY"
KEY_BYTES = 32


def default_key_path() -> Path:
    return Path(os.environ.get(KEY_ENV) or Path.home() / ".config" / "reusebench" / "tap.key")


class KeyFileError(ValueError):
    """A key file that cannot serve; the message names it."""


def load_key(path: Path, results_dir: Path) -> bytes:
    """The key in `path`, made there (0600) when missing. A key inside `results_dir` is refused: it would travel
    with the hashes it protects; so is one that others may read or that another user owns."""
    path, results = Path(path).expanduser().resolve(), Path(results_dir).resolve()
    if path == results or results in path.parents:
        raise KeyFileError(f"--key-file {path}: inside the results directory {results}; keep the key outside it")
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
        found = path.stat()
        key = path.read_bytes()
    except OSError as exc:  # an unwritable HOME, a directory where the file should be
        raise KeyFileError(f"--key-file {path}: cannot make or read it ({exc.strerror or type(exc).__name__}); "
                           f"pass --key-file or set ${KEY_ENV} to a writable place") from None
    if found.st_mode & 0o077:
        raise KeyFileError(f"--key-file {path}: mode {found.st_mode & 0o777:o}: others may read it; chmod 600 it")
    if found.st_uid != os.getuid():
        raise KeyFileError(f"--key-file {path}: owned by uid {found.st_uid}, not this user ({os.getuid()})")
    if len(key) < 16:
        raise KeyFileError(f"--key-file {path}: {len(key)} bytes; a key needs at least 16")
    return key


class Hasher:
    """Keyed hashes of token ids, as the records' ``prompt_hash`` and ``output_hash`` (16 hex digits)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def tokens(self, ids: Sequence[int] | np.ndarray) -> str:
        data = np.asarray(ids, dtype=np.int32).tobytes()
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()[:16]
