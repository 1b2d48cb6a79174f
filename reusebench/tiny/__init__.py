"""Tiny random-weight GGUF models that the real llama-server loads on a CPU.

Every file is generated on demand from a fixed recipe and seed, so the same
recipe always yields the same bytes. Output is gibberish, but greedy decoding is
deterministic and every cache mechanism behaves as with a real model, so
"reused output equals cold output" is a meaningful check.

Shapes are written in ggml `ne` order (as in llama.cpp); numpy shapes are the
reverse. One file per architecture (``llama``, ``granitehybrid``, ``nemotron_h``, ``qwen35``, ``glm5_next``, ``gemma3``),
what they share in ``shapes`` and ``layers``, adapters and projectors in ``adapters``; this module names the
recipes and keeps the generated files in the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from gguf import GGUFWriter

from reusebench.tiny import archs
from reusebench.tiny.adapters import build_lora, build_mmproj
from reusebench.tiny.gemma3 import build_gemma3
from reusebench.tiny.glm5_next import build_glm5_next
from reusebench.tiny.granitehybrid import build_granitehybrid
from reusebench.tiny.llama import build_llama
from reusebench.tiny.nemotron_h import build_nemotron_h
from reusebench.tiny.qwen35 import build_qwen35
from reusebench.tiny.shapes import (  # the names the rest of the library and the tests use
    BOS_ID,
    CHAT_TEMPLATE,
    CONTEXT_LENGTH,
    FACTORY_VERSION,
    LONG_MEMORY_RECURRENT,
    LORA_RANK,
    N_EMBD,
    N_FF,
    N_HEAD,
    N_HEAD_KV,
    SPEC_PREFIX,
    WORDS,
    AttentionShape,
    Recipe,
)

__all__ = [
    "BOS_ID",
    "FACTORY_VERSION",
    "LORA_RANK",
    "MODEL_NAMES",
    "RECIPES",
    "SPEC_PREFIX",
    "WORDS",
    "Recipe",
    "default_cache_dir",
    "is_tiny_spec",
    "lora_path",
    "main",
    "mmproj_path",
    "projector_path",
    "model_path",
]

RECIPES: dict[str, Recipe] = {
    # One attention head: at 128K a tiny model's prefill is almost all attention (prompt length
    # squared times heads times head size), and report A's 128K steps run six full prefills.
    # How the server reuses a prompt does not depend on the head count.
    "qwen35": Recipe("qwen35", "DDDA", seed=3501, attention=AttentionShape(heads=1, kv_heads=1)),
    # qwen35 with one NextN block: b11434 drafts with it (--spec-type draft-mtp), and qwen35 is on
    # llm_arch_supports_rs_rollback's list, so a rejected draft rolls the Gated DeltaNet state back (n_rs_seq).
    "qwen35-mtp": Recipe("qwen35", "DDDAN", seed=3502, attention=AttentionShape(heads=1, kv_heads=1)),
    "granitehybrid": Recipe("granitehybrid", "MMAM", seed=4001),
    "granitehybrid-longmem": Recipe("granitehybrid", "MMAM", seed=4002, recurrent=LONG_MEMORY_RECURRENT),
    "nemotron_h": Recipe("nemotron_h", "MAMF", seed=5001),
    "nemotron_h-longmem": Recipe("nemotron_h", "MAMF", seed=5002, recurrent=LONG_MEMORY_RECURRENT),
    "llama": Recipe("llama", "AAAA", seed=1001),
    "glm5-next": Recipe("glm5-next", "KKKA", seed=6001),
    # A 128-token window: with the base profile's -ub 512 the window's cache holds 768 cells, so a prompt of 2K
    # already lies mostly outside it, as a 32K prompt does for Gemma 3's 512-token window.
    "gemma3": Recipe("gemma3", "WWWWWA", seed=7001, window=128),
}



MODEL_NAMES: tuple[str, ...] = tuple(RECIPES)



def default_cache_dir() -> Path:
    """`$REUSEBENCH_MODEL_CACHE`, else `~/.cache/reusebench/models`."""
    configured = os.environ.get("REUSEBENCH_MODEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "models"



def model_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of the tiny model `name`, generated into the cache first if missing; `arch-ARCH` is any architecture
    of the pinned build, written by its test-llama-archs (``tiny.archs``)."""
    if name.startswith(archs.PREFIX):
        arch = name.removeprefix(archs.PREFIX)
        return _cached(f"{name}-{_digest('arch', arch, archs.SEED)}.gguf", lambda: archs.retokenized(arch), cache_dir)
    recipe = _recipe(name)
    build = _MODEL_BUILDERS[recipe.arch]
    return _cached(f"{name}-{_digest('model', recipe)}.gguf", lambda: build(name, recipe), cache_dir)



def lora_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of a rank-4 LoRA adapter for the tiny model `name` (on attn_q and attn_v, or glm5-next's first MLP)."""
    recipe = _recipe(name)
    return _cached(f"{name}-lora-{_digest('lora', recipe)}.gguf", lambda: build_lora(recipe), cache_dir)



def mmproj_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of a tiny CLIP projector (`--mmproj`) whose output matches `name`'s n_embd."""
    _recipe(name)
    # Every tiny text model has the same n_embd, so they share one projector file.
    return projector_path(N_EMBD, cache_dir)


def projector_path(n_embd: int, cache_dir: Path | None = None) -> Path:
    """Path of a tiny CLIP projector whose output is `n_embd` wide: it feeds any text model of that width (a real
    one too: ``mmproj: tiny:projector`` in a profile)."""
    return _cached(f"mmproj-e{n_embd}-{_digest('mmproj', n_embd)}.gguf", lambda: build_mmproj(n_embd), cache_dir)



def is_tiny_spec(spec: str) -> bool:
    """True for model specs of the form `tiny:NAME`."""
    return spec.startswith(SPEC_PREFIX)



def _recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown tiny model {name!r}; valid names: {', '.join(MODEL_NAMES)}") from None



def _digest(*parts: object) -> str:
    """Short hash of what shapes a file, so a changed recipe gets a new file name.

    Covers the recipe, the vocabulary and the model-wide dimensions; any other change
    to a generator must bump FACTORY_VERSION.
    """
    shared = (FACTORY_VERSION, N_EMBD, N_HEAD, N_HEAD_KV, N_FF, CONTEXT_LENGTH, WORDS, CHAT_TEMPLATE)
    return hashlib.sha256(repr((shared, parts)).encode()).hexdigest()[:10]



def _cached(file_name: str, build: Callable[[], GGUFWriter], cache_dir: Path | None) -> Path:
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    target = directory / file_name
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    writer = build()
    # Write beside the target and rename, so a concurrent reader never sees half a file.
    partial = directory / f".{file_name}.{os.getpid()}.partial"
    try:
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target



_MODEL_BUILDERS: dict[str, Callable[[str, Recipe], GGUFWriter]] = {
    "llama": build_llama,
    "granitehybrid": build_granitehybrid,
    "nemotron_h": build_nemotron_h,
    "qwen35": build_qwen35,
    "glm5-next": build_glm5_next,
    "gemma3": build_gemma3,
}



def main(argv: Sequence[str] | None = None) -> int:
    """Generate the named tiny models (or their adapters/projectors) and print their paths."""
    parser = argparse.ArgumentParser(prog="python -m reusebench.tiny", description=main.__doc__)
    parser.add_argument("names", nargs="+", metavar="NAME", choices=MODEL_NAMES, help=", ".join(MODEL_NAMES))
    parser.add_argument(
        "--dir",
        type=Path,
        help="cache directory (default: $REUSEBENCH_MODEL_CACHE or ~/.cache/reusebench/models)",
    )
    parser.add_argument("--kind", choices=("model", "lora", "mmproj"), default="model")
    args = parser.parse_args(argv)
    path_of = {"model": model_path, "lora": lora_path, "mmproj": mmproj_path}[args.kind]
    for name in args.names:
        print(path_of(name, args.dir))
    return 0


