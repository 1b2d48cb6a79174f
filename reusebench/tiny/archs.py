"""A tiny model of any architecture the pinned build knows: llama.cpp's ``test-llama-archs`` writes the layers, the
suite gives it a tokenizer and a context a benchmark can use.

``test-llama-archs -a ^ARCH$ -o DIR`` writes a random model with every tensor its architecture needs
(``ARCH-dense.gguf``, or ``ARCH-moe.gguf`` where it has only a mixture of experts), with a dummy tokenizer of 128
tokens and a trained context of 256. Here its tokenizer keys are replaced by the tiny models' vocabulary (every
" word" one token, so prompt lengths are exact), its embedding and output matrices are drawn again at that
vocabulary's size (the output rows of special and byte tokens zeroed, so greedy decoding emits words), and its
context length raised. Every other key and tensor is copied as written: the memory the server builds is the
architecture's own.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGMLQuantizationType

from reusebench.llama import arch_writer
from reusebench.tiny.layers import add_tokenizer
from reusebench.tiny.shapes import CONTEXT_LENGTH, FIRST_TEXT_TOKEN_ID

PREFIX = "arch-"  # tiny:arch-lfm2
SEED = 42
WRITE_TIMEOUT_S = 120.0
_REDRAWN = ("token_embd.weight", "output.weight")


class ArchModelError(RuntimeError):
    """test-llama-archs could not write the architecture; the message gives its own words."""


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)  # a model made on the way must not mix into a command's results on stdout


def written(arch: str, into: Path, progress: Callable[[str], None] = _to_stderr) -> Path:
    """The file test-llama-archs writes for `arch` (its dense variant where it writes both)."""
    tool = arch_writer.path(progress)
    subprocess.run([str(tool), "-a", f"^{re.escape(arch)}$", "-o", str(into), "-s", str(SEED)],
                   capture_output=True, timeout=WRITE_TIMEOUT_S)
    files = sorted(into.glob("*.gguf"), key=lambda p: (not p.stem.endswith("-dense"), p.name))
    if not files:  # its log thread may not flush the line that says why before the process exits
        raise ArchModelError("test-llama-archs writes no file for it: its saver does not support the architecture "
                             "(it says so when its log is flushed), or its source skips it")
    return files[0]


def retokenized(arch: str, progress: Callable[[str], None] = _to_stderr) -> GGUFWriter:
    """A writer holding `arch`'s test-llama-archs model with the tiny vocabulary and a long context."""
    with tempfile.TemporaryDirectory() as scratch:
        reader = GGUFReader(written(arch, Path(scratch), progress))
        writer = GGUFWriter(None, arch)
        skipped = {f"{arch}.context_length", f"{arch}.vocab_size", "general.architecture"}
        for field in reader.fields.values():
            if field.name.startswith(("GGUF.", "tokenizer.")) or field.name in skipped:
                continue
            kind = field.types[0]
            value = field.contents()
            if kind == GGUFValueType.ARRAY and not value:
                continue  # an empty array (gguf-py cannot write one) reads as an absent key
            writer.add_key_value(field.name, value, kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
        writer.add_context_length(CONTEXT_LENGTH)
        tokens = add_tokenizer(writer)
        rng = np.random.default_rng(SEED)
        names = {tensor.name for tensor in reader.tensors}
        for tensor in reader.tensors:
            data = np.array(tensor.data)  # a copy: the reader's map closes with the scratch directory
            if tensor.name in _REDRAWN:
                n_embd = int(tensor.shape[0])
                std = 1.0 if tensor.name == "token_embd.weight" else 0.02
                data = rng.normal(0.0, std, size=(len(tokens), n_embd)).astype(np.float32)
                if tensor.name == "output.weight" or "output.weight" not in names:  # tied: the embedding decodes
                    data[:FIRST_TEXT_TOKEN_ID] = 0.0
                writer.add_tensor(tensor.name, data)
            elif tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                writer.add_tensor(tensor.name, data)
            else:
                writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
        return writer
