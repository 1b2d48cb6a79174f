"""Read what the suite needs of a GGUF file's header, and check that the file is complete before a server starts.

llama-server reports a corrupt or truncated model only in its log, and it can exit before that line is written;
reading the header and tensor table here gives an error that names the file instead. The header is read with
``struct`` in one pass that keeps scalar values and skips arrays (a real model's 262,144 token strings among
them): gguf-py's reader builds every array as numpy views and takes seconds on a real model's vocabulary, which
a dry run must not wait for.
"""

from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
# GGUF value types: the struct format of each fixed-size one; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a complete GGUF file, or lacks a key the suite reads (the message names it)."""


@dataclass(frozen=True)
class Header:
    """A GGUF file's scalar keys and where its tensor data ends."""

    values: dict[str, int | float | bool | str]  # scalar keys only; an array's key holds its length
    data_end: int  # the byte where the last tensor's data ends


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int | float | bool:
        value = struct.unpack_from("<" + fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = int(self.take("Q"))
        text = self.data[self.at:self.at + length]
        if len(text) < length:
            raise struct.error("string past the end of the file")
        self.at += length
        return text.decode("utf-8", errors="replace")

    def skip(self, kind: int, count: int) -> None:
        if kind == _STRING:
            for _ in range(count):
                self.at += 8 + int(struct.unpack_from("<Q", self.data, self.at)[0])
        elif kind in _SCALARS:
            self.at += struct.calcsize(_SCALARS[kind]) * count
        else:
            raise struct.error(f"value type {kind} inside an array")

    def value(self, kind: int) -> int | float | bool | str:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = int(self.take("I")), int(self.take("Q"))
            self.skip(inner, count)
            return count
        if kind not in _SCALARS:
            raise struct.error(f"unknown value type {kind}")
        return self.take(_SCALARS[kind])


def read_header(path: Path) -> Header:
    """The scalar keys and the tensor table's extent of `path` (cached per file, size and time)."""
    stat = path.stat()
    return _read_header(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _read_header(path: Path, size: int, mtime_ns: int) -> Header:
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(path, data)
    except (OSError, ValueError) as exc:  # mmap of an empty file is a ValueError
        if isinstance(exc, GgufError):
            raise
        raise GgufError(f"{path}: not a readable GGUF file ({getattr(exc, 'strerror', None) or exc})") from exc


def _parse(path: Path, data: mmap.mmap) -> Header:
    """The header of a mapped file: only the pages it lies in are read, not the model's weights."""
    if data[:4] != MAGIC:
        raise GgufError(f"{path}: not a readable GGUF file (it does not start with GGUF)")
    cursor = _Cursor(data)
    try:
        cursor.at = 4
        cursor.take("I")  # version
        n_tensors, n_kv = int(cursor.take("Q")), int(cursor.take("Q"))
        values: dict[str, int | float | bool | str] = {}
        for _ in range(n_kv):
            key = cursor.string()
            values[key] = cursor.value(int(cursor.take("I")))
        tensors = []
        for _ in range(n_tensors):
            cursor.string()  # name
            dims = [int(cursor.take("Q")) for _ in range(int(cursor.take("I")))]
            kind, offset = int(cursor.take("I")), int(cursor.take("Q"))
            tensors.append((dims, kind, offset))
    except struct.error as exc:
        raise GgufError(f"{path}: not a readable GGUF file (corrupt or truncated: {exc})") from exc
    alignment = int(values.get("general.alignment", 32))
    data_start = -(-cursor.at // alignment) * alignment
    end = data_start
    for dims, kind, offset in tensors:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except ValueError as exc:
            raise GgufError(f"{path}: not a readable GGUF file (unknown tensor type {kind})") from exc
        elements = 1
        for dim in dims:
            elements *= dim
        end = max(end, data_start + offset + elements // block * type_size)
    return Header(values, end)


_ARRAY_DTYPES = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8", 12: "<f8"}


def number_array(path: Path, key: str) -> np.ndarray:
    """One array of numbers from the header (``tokenizer.ggml.token_type``), read straight from the mapped file."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        try:
            cursor.at = 8
            cursor.take("Q")  # tensors
            for _ in range(int(cursor.take("Q"))):
                name, kind = cursor.string(), int(cursor.take("I"))
                if name != key:
                    cursor.value(kind)
                    continue
                inner, count = (int(cursor.take("I")), int(cursor.take("Q"))) if kind == _ARRAY else (-1, 0)
                if inner not in _ARRAY_DTYPES:
                    raise GgufError(f"{path}: {key} is not an array of numbers")
                dtype = np.dtype(_ARRAY_DTYPES[inner])
                return np.frombuffer(data[cursor.at:cursor.at + count * dtype.itemsize], dtype=dtype)
        except struct.error as exc:
            raise GgufError(f"{path}: not a readable GGUF file (corrupt or truncated: {exc})") from exc
    raise GgufError(f"{path}: no {key}")


def architecture(path: Path) -> str:
    """The model's ``general.architecture``, e.g. "qwen35"."""
    found = read_header(path).values.get("general.architecture")
    if not isinstance(found, str):
        raise GgufError(f"{path}: no general.architecture")
    return found


def trained_context(path: Path) -> int | None:
    """The model's ``{arch}.context_length``: llama-server caps every slot's context at it; None where it is not set."""
    found = read_header(path).values.get(f"{architecture(path)}.context_length")
    return None if found is None else int(found)


def embedding_length(path: Path) -> int:
    """The model's ``{arch}.embedding_length``: the width a projector's output must have to feed it."""
    found = read_header(path).values.get(f"{architecture(path)}.embedding_length")
    if found is None:
        raise GgufError(f"{path}: no {architecture(path)}.embedding_length")
    return int(found)


def check_gguf(path: Path) -> None:
    """Raise GgufError unless ``path`` has a valid header and every tensor's data lies inside the file."""
    header = read_header(path)
    size = path.stat().st_size
    if header.data_end > size:
        raise GgufError(f"{path}: truncated GGUF file: tensor data ends at byte {header.data_end:,}, file has {size:,}")
