"""Tiny random-weight GGUF models that the real llama-server loads on a CPU.

Every file is generated on demand from a fixed recipe and seed, so the same
recipe always yields the same bytes. Output is gibberish, but greedy decoding is
deterministic and every cache mechanism behaves as with a real model, so
"reused output equals cold output" is a meaningful check.

Shapes are written in ggml `ne` order (as in llama.cpp); numpy shapes are the
reverse.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

from reusebench.llama.facts import CHATML_TEMPLATE

__all__ = [
    "FACTORY_VERSION",
    "MODEL_NAMES",
    "SPEC_PREFIX",
    "WORDS",
    "default_cache_dir",
    "is_tiny_spec",
    "lora_path",
    "main",
    "mmproj_path",
    "model_path",
]

# Bump whenever a generator changes, so files cached by an older recipe are never reused.
FACTORY_VERSION = 1

SPEC_PREFIX = "tiny:"

CONTEXT_LENGTH = 262_144  # 128K prompts plus a wide margin
N_EMBD = 128
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = N_EMBD // N_HEAD
N_FF = 256
NORM_EPS = 1e-5
ROPE_FREQ_BASE = 1e4
WEIGHT_STD = 0.02

# Mamba2 layers (granitehybrid, nemotron_h). The loader asserts inner == 2 * n_embd.
MAMBA_INNER = 2 * N_EMBD
MAMBA_STATE = 16
MAMBA_HEADS = 8
MAMBA_GROUPS = 1
CONV_KERNEL = 4

# Gated DeltaNet layers (qwen35): the state size is both the k and the v head dim.
DELTA_HEAD_DIM = 32
DELTA_K_HEADS = 2
DELTA_V_HEADS = 4

# glm5-next: KDA (Kimi Delta Attention) layers, nope-only MLA layers with a k-pool sparse
# indexer, four hyper-connection residual streams and a DeepSeek-style MoE.
KDA_HEAD_DIM = 32  # KDA runs the model-wide N_HEAD heads; the state is N_HEAD x 32 x 32
MLA_Q_RANK = 64
MLA_KV_RANK = 32  # the attention cache holds only this latent per token
MLA_HEAD_DIM = 32  # per-head query/key and value width, after decompressing the latent
INDEXER_HEADS = 2
INDEXER_HEAD_DIM = 16
INDEXER_KPOOL = 4  # the indexer scores pools of 4 consecutive tokens
INDEXER_TOP_K = 256  # tokens each query attends to: far fewer than a long prompt, so attention is sparse
HC_STREAMS = 4  # the loader asserts exactly 4 hyper-connection streams
HC_SINKHORN_ITERS = 4
HC_EPS = 1e-6
DENSE_LEAD_LAYERS = 1  # a plain gated MLP first, MoE after, as in the real model
N_EXPERT = 4
N_EXPERT_USED = 2
N_FF_EXP = 64  # each routed expert and the one shared expert

LORA_RANK = 4
LORA_ALPHA = 8.0
LORA_STD = 0.2  # large enough that applying the adapter visibly changes the output

# Vision tower of the mmproj: 32 px images in 8 px patches.
CLIP_IMAGE = 32
CLIP_PATCH = 8
CLIP_WIDTH = 64
CLIP_FF = 128  # must differ from CLIP_WIDTH or the loader swaps ffn_up and ffn_down
CLIP_BLOCKS = 2
CLIP_HEADS = 4

WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as",
    "was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
    "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
    "were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
    "if", "more", "when", "will", "would", "who", "so", "no", "she", "other",
    "its", "may", "these", "what", "them", "than", "some", "him", "time", "into",
    "only", "do", "could", "new", "about", "two", "first", "then", "also", "any",
    "like", "our", "over", "such", "my", "me", "out", "up", "people", "said",
    "many", "should", "years", "must", "most", "after", "made", "each", "well", "where",
    "very", "world", "house", "water", "river", "city", "road", "night", "light", "stone",
    "garden", "window", "table", "paper", "letter", "story", "music", "market", "morning", "evening",
    "summer", "winter", "forest", "mountain", "island", "village", "bridge", "tower", "field", "harbor",
    "ship", "train", "engine", "machine", "signal", "number", "answer", "question", "problem", "system",
    "memory", "cache", "model", "layer", "token", "prompt", "server", "harvest", "record", "report",
    "simple", "quiet", "bright", "dark", "early", "late", "small", "large", "quick", "slow",
    "green", "blue", "red", "yellow", "white", "black", "silver", "golden", "warm", "cold",
    "walk", "run", "read", "write", "build", "open", "close", "carry", "follow", "remember",
    "begin", "finish", "listen", "speak", "watch", "find", "keep", "leave", "bring", "change",
    "teacher", "doctor", "farmer", "painter", "sailor", "child", "friend", "family", "neighbor", "stranger",
    "apple", "bread", "honey", "salt", "coffee", "orange", "cherry", "lemon", "butter", "cheese",
    "because", "before", "between", "during", "without", "under", "again", "always", "never", "often",
)

SPECIAL_TOKENS: tuple[tuple[str, TokenType], ...] = (
    ("<unk>", TokenType.UNKNOWN),
    ("<s>", TokenType.CONTROL),
    ("</s>", TokenType.CONTROL),
    ("<|im_start|>", TokenType.CONTROL),
    ("<|im_end|>", TokenType.CONTROL),
)
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
# Ids below this are special or byte tokens; their output rows are zero so greedy
# decoding never emits a lone UTF-8 byte (which makes /completion answer HTTP 500).
FIRST_TEXT_TOKEN_ID = len(SPECIAL_TOKENS) + 256

CHAT_TEMPLATE = CHATML_TEMPLATE

@dataclass(frozen=True)
class RecurrentInit:
    """How the recurrent (Mamba2, DeltaNet or KDA) layers of a model are initialised."""

    log_decay: tuple[float, float]  # decay A = -exp(U(lo, hi)), always negative
    conv_std: float
    # A shared conv bias adds the same vector to every token's state contribution and
    # drowns out what is token specific.
    conv_bias: bool
    skip: float  # D, the connection that bypasses the state
    out_std: float


DEFAULT_RECURRENT = RecurrentInit(
    log_decay=(0.0, 1.5), conv_std=WEIGHT_STD, conv_bias=True, skip=1.0, out_std=WEIGHT_STD
)
# With the default the state forgets within a few tokens and barely reaches the logits,
# so a wrong reuse still gives the right answer. Here |A| ~ 1e-4..1e-3 keeps every
# token in the state, and a token-specific state with no bypass dominates the residual
# stream, so a stale state changes the greedy output (tuned against llama-server).
LONG_MEMORY_RECURRENT = RecurrentInit(
    log_decay=(math.log(1e-4), math.log(1e-3)), conv_std=0.2, conv_bias=False, skip=0.0, out_std=0.2
)


@dataclass(frozen=True)
class AttentionShape:
    """Query and key/value heads of a model's attention layers (each HEAD_DIM wide)."""

    heads: int = N_HEAD
    kv_heads: int = N_HEAD_KV


@dataclass(frozen=True)
class Recipe:
    """Everything that determines one generated text model."""

    arch: str
    # One letter per layer: A attention, M Mamba2, D Gated DeltaNet, K KDA, F MLP only.
    layers: str
    seed: int
    recurrent: RecurrentInit = DEFAULT_RECURRENT
    attention: AttentionShape = AttentionShape()


RECIPES: dict[str, Recipe] = {
    # One attention head: at 128K a tiny model's prefill is almost all attention (prompt length
    # squared times heads times head size), and report A's 128K steps run six full prefills.
    # How the server reuses a prompt does not depend on the head count.
    "qwen35": Recipe("qwen35", "DDDA", seed=3501, attention=AttentionShape(heads=1, kv_heads=1)),
    "granitehybrid": Recipe("granitehybrid", "MMAM", seed=4001),
    "granitehybrid-longmem": Recipe("granitehybrid", "MMAM", seed=4002, recurrent=LONG_MEMORY_RECURRENT),
    "nemotron_h": Recipe("nemotron_h", "MAMF", seed=5001),
    "nemotron_h-longmem": Recipe("nemotron_h", "MAMF", seed=5002, recurrent=LONG_MEMORY_RECURRENT),
    "llama": Recipe("llama", "AAAA", seed=1001),
    "glm5-next": Recipe("glm5-next", "KKKA", seed=6001),
}

MODEL_NAMES: tuple[str, ...] = tuple(RECIPES)


def default_cache_dir() -> Path:
    """`$REUSEBENCH_MODEL_CACHE`, else `~/.cache/reusebench/models`."""
    configured = os.environ.get("REUSEBENCH_MODEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "models"


def model_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of the tiny model `name`, generated into the cache first if missing."""
    recipe = _recipe(name)
    build = _MODEL_BUILDERS[recipe.arch]
    return _cached(f"{name}-{_digest('model', recipe)}.gguf", lambda: build(name, recipe), cache_dir)


def lora_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of a rank-4 LoRA adapter for the tiny model `name` (on attn_q and attn_v, or glm5-next's first MLP)."""
    recipe = _recipe(name)
    return _cached(f"{name}-lora-{_digest('lora', recipe)}.gguf", lambda: _build_lora(recipe), cache_dir)


def mmproj_path(name: str, cache_dir: Path | None = None) -> Path:
    """Path of a tiny CLIP projector (`--mmproj`) whose output matches `name`'s n_embd."""
    _recipe(name)
    # Every tiny text model has the same n_embd, so they share one projector file.
    return _cached(f"mmproj-e{N_EMBD}-{_digest('mmproj', N_EMBD)}.gguf", lambda: _build_mmproj(N_EMBD), cache_dir)


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


class _Tensors:
    """A GGUFWriter plus the seeded generator its random f32 tensors come from."""

    def __init__(self, writer: GGUFWriter, seed: int) -> None:
        self.writer = writer
        self.rng = np.random.default_rng(seed)

    def random(self, *ne: int, std: float = WEIGHT_STD) -> np.ndarray:
        return self.rng.standard_normal(ne[::-1], dtype=np.float32) * np.float32(std)

    def normal(self, name: str, *ne: int, std: float = WEIGHT_STD) -> None:
        self.add(name, self.random(*ne, std=std))

    def ones(self, name: str, *ne: int) -> None:
        self.add(name, np.ones(ne[::-1], dtype=np.float32))

    def zeros(self, name: str, *ne: int) -> None:
        self.add(name, np.zeros(ne[::-1], dtype=np.float32))

    def add(self, name: str, values: np.ndarray) -> None:
        self.writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    def decay(self, name: str, log_range: tuple[float, float], *ne: int) -> None:
        self.add(name, -np.exp(self.rng.uniform(*log_range, size=ne[::-1])))


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style vocab in which every " word" of WORDS is exactly one token."""
    tokens = [text for text, _ in SPECIAL_TOKENS] + [f"<0x{byte:02X}>" for byte in range(256)]
    types = [int(kind) for _, kind in SPECIAL_TOKENS] + [int(TokenType.BYTE)] * 256
    pieces = ["▁"] + [chr(code) for code in range(0x21, 0x7F)]
    # Every prefix must exist too: SentencePiece merges bigrams one character at a time.
    pieces += [f"▁{word[:end]}" for word in WORDS for end in range(1, len(word) + 1)]
    pieces = list(dict.fromkeys(pieces))
    scores = [0.0] * len(tokens) + [float(len(piece)) for piece in pieces]
    return tokens + pieces, scores, types + [int(TokenType.NORMAL)] * len(pieces)


def _start_text_model(name: str, recipe: Recipe) -> _Tensors:
    """Writer with the metadata, tokenizer and global tensors every text model shares."""
    arch, n_layers = recipe.arch, len(recipe.layers)
    writer = GGUFWriter(None, arch)
    writer.add_name(f"reusebench tiny {name}")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layers)
    writer.add_head_count(recipe.attention.heads)
    writer.add_layer_norm_rms_eps(NORM_EPS)
    writer.add_rope_freq_base(ROPE_FREQ_BASE)

    tokens, scores, types = _vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    tensors = _Tensors(writer, recipe.seed)
    tensors.normal("token_embd.weight", N_EMBD, len(tokens), std=1.0)
    tensors.ones("output_norm.weight", N_EMBD)
    output = tensors.random(N_EMBD, len(tokens))
    output[:FIRST_TEXT_TOKEN_ID] = 0.0
    tensors.add("output.weight", output)
    return tensors


def _attention_q_width(recipe: Recipe) -> int:
    # qwen35's gated attention projects query and gate together.
    width = recipe.attention.heads * HEAD_DIM
    return 2 * width if recipe.arch == "qwen35" else width


def _attention(t: _Tensors, il: int, recipe: Recipe) -> None:
    kv_width = recipe.attention.kv_heads * HEAD_DIM
    t.normal(f"blk.{il}.attn_q.weight", N_EMBD, _attention_q_width(recipe))
    t.normal(f"blk.{il}.attn_k.weight", N_EMBD, kv_width)
    t.normal(f"blk.{il}.attn_v.weight", N_EMBD, kv_width)
    t.normal(f"blk.{il}.attn_output.weight", recipe.attention.heads * HEAD_DIM, N_EMBD)


def _gated_ffn(t: _Tensors, il: int) -> None:
    t.normal(f"blk.{il}.ffn_gate.weight", N_EMBD, N_FF)
    t.normal(f"blk.{il}.ffn_up.weight", N_EMBD, N_FF)
    t.normal(f"blk.{il}.ffn_down.weight", N_FF, N_EMBD)


def _mamba2(t: _Tensors, il: int, init: RecurrentInit) -> None:
    conv_channels = MAMBA_INNER + 2 * MAMBA_GROUPS * MAMBA_STATE
    t.normal(f"blk.{il}.ssm_in.weight", N_EMBD, conv_channels + MAMBA_INNER + MAMBA_HEADS)
    t.normal(f"blk.{il}.ssm_conv1d.weight", CONV_KERNEL, conv_channels, std=init.conv_std)
    if init.conv_bias:
        t.normal(f"blk.{il}.ssm_conv1d.bias", conv_channels)
    else:
        t.zeros(f"blk.{il}.ssm_conv1d.bias", conv_channels)
    t.normal(f"blk.{il}.ssm_dt.bias", MAMBA_HEADS)
    t.decay(f"blk.{il}.ssm_a", init.log_decay, 1, MAMBA_HEADS)
    t.add(f"blk.{il}.ssm_d", np.full((MAMBA_HEADS, 1), init.skip, dtype=np.float32))
    t.ones(f"blk.{il}.ssm_norm.weight", MAMBA_INNER // MAMBA_GROUPS, MAMBA_GROUPS)
    t.normal(f"blk.{il}.ssm_out.weight", MAMBA_INNER, N_EMBD, std=init.out_std)


def _add_mamba2_metadata(writer: GGUFWriter) -> None:
    writer.add_ssm_conv_kernel(CONV_KERNEL)
    writer.add_ssm_inner_size(MAMBA_INNER)
    writer.add_ssm_state_size(MAMBA_STATE)
    writer.add_ssm_time_step_rank(MAMBA_HEADS)
    writer.add_ssm_group_count(MAMBA_GROUPS)


def _per_layer(recipe: Recipe, value: int, kinds: str) -> list[int]:
    """A per-layer metadata array: `value` on layers whose kind is in `kinds`, else 0."""
    return [value if kind in kinds else 0 for kind in recipe.layers]


def _mixer_then_ffn_layers(t: _Tensors, recipe: Recipe) -> None:
    """llama-style blocks: norm, attention or Mamba2, norm, gated MLP."""
    for il, kind in enumerate(recipe.layers):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        if kind == "A":
            _attention(t, il, recipe)
        else:
            _mamba2(t, il, recipe.recurrent)
        t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        _gated_ffn(t, il)


def _build_llama(name: str, recipe: Recipe) -> GGUFWriter:
    t = _start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    t.writer.add_head_count_kv(recipe.attention.kv_heads)
    t.writer.add_rope_dimension_count(HEAD_DIM)
    _mixer_then_ffn_layers(t, recipe)
    return t.writer


def _build_granitehybrid(name: str, recipe: Recipe) -> GGUFWriter:
    t = _start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    # A zero kv-head count is what marks a layer as recurrent.
    t.writer.add_head_count_kv(_per_layer(recipe, recipe.attention.kv_heads, "A"))
    t.writer.add_rope_dimension_count(HEAD_DIM)
    # Granite's scalars, set to the identity so the model is a plain hybrid.
    t.writer.add_embedding_scale(1.0)
    t.writer.add_residual_scale(1.0)
    t.writer.add_logit_scale(1.0)
    t.writer.add_attention_scale(1.0 / math.sqrt(HEAD_DIM))
    _add_mamba2_metadata(t.writer)
    _mixer_then_ffn_layers(t, recipe)
    return t.writer


def _build_nemotron_h(name: str, recipe: Recipe) -> GGUFWriter:
    t = _start_text_model(name, recipe)
    # Layers with neither kv heads nor an MLP are the recurrent ones.
    t.writer.add_feed_forward_length(_per_layer(recipe, N_FF, "F"))
    t.writer.add_head_count_kv(_per_layer(recipe, recipe.attention.kv_heads, "A"))
    t.writer.add_key_length(HEAD_DIM)
    t.writer.add_value_length(HEAD_DIM)
    t.writer.add_layer_norm_eps(NORM_EPS)
    _add_mamba2_metadata(t.writer)
    for il, kind in enumerate(recipe.layers):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        if kind == "A":
            _attention(t, il, recipe)
        elif kind == "M":
            _mamba2(t, il, recipe.recurrent)
        else:
            t.normal(f"blk.{il}.ffn_up.weight", N_EMBD, N_FF)
            t.normal(f"blk.{il}.ffn_down.weight", N_FF, N_EMBD)
    return t.writer


def _build_qwen35(name: str, recipe: Recipe) -> GGUFWriter:
    t = _start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    t.writer.add_head_count_kv(recipe.attention.kv_heads)
    t.writer.add_key_length(HEAD_DIM)
    t.writer.add_value_length(HEAD_DIM)
    t.writer.add_full_attention_interval(recipe.layers.index("A") + 1)
    # Partial rotary with IMRoPE sections: the attention cache cannot be shifted,
    # which is what makes the server disable --cache-reuse on this family.
    t.writer.add_rope_dimension_count(8)
    t.writer.add_rope_dimension_sections([2, 1, 1, 0])
    t.writer.add_ssm_conv_kernel(CONV_KERNEL)
    t.writer.add_ssm_state_size(DELTA_HEAD_DIM)
    t.writer.add_ssm_group_count(DELTA_K_HEADS)
    t.writer.add_ssm_time_step_rank(DELTA_V_HEADS)
    t.writer.add_ssm_inner_size(DELTA_HEAD_DIM * DELTA_V_HEADS)
    key_width, value_width = DELTA_K_HEADS * DELTA_HEAD_DIM, DELTA_V_HEADS * DELTA_HEAD_DIM
    for il, kind in enumerate(recipe.layers):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        if kind == "A":
            _attention(t, il, recipe)
            t.ones(f"blk.{il}.attn_q_norm.weight", HEAD_DIM)
            t.ones(f"blk.{il}.attn_k_norm.weight", HEAD_DIM)
        else:
            t.normal(f"blk.{il}.attn_qkv.weight", N_EMBD, 2 * key_width + value_width)
            t.normal(f"blk.{il}.attn_gate.weight", N_EMBD, value_width)
            t.normal(f"blk.{il}.ssm_conv1d.weight", CONV_KERNEL, 2 * key_width + value_width)
            t.normal(f"blk.{il}.ssm_dt.bias", DELTA_V_HEADS)
            t.decay(f"blk.{il}.ssm_a", recipe.recurrent.log_decay, DELTA_V_HEADS)
            t.normal(f"blk.{il}.ssm_beta.weight", N_EMBD, DELTA_V_HEADS)
            t.normal(f"blk.{il}.ssm_alpha.weight", N_EMBD, DELTA_V_HEADS)
            t.ones(f"blk.{il}.ssm_norm.weight", DELTA_HEAD_DIM)
            t.normal(f"blk.{il}.ssm_out.weight", value_width, N_EMBD)
        t.ones(f"blk.{il}.post_attention_norm.weight", N_EMBD)
        _gated_ffn(t, il)
    return t.writer


def _kda(t: _Tensors, il: int, init: RecurrentInit) -> None:
    """Kimi Delta Attention: conv'd q/k/v, a per-channel decay and a gated, normed output."""
    d_inner = N_HEAD * KDA_HEAD_DIM
    for proj in ("q", "k", "v"):
        t.normal(f"blk.{il}.attn_{proj}.weight", N_EMBD, d_inner)
        t.normal(f"blk.{il}.ssm_conv1d_{proj}.weight", CONV_KERNEL, 1, d_inner, std=init.conv_std)
    # Low-rank decay (f) and output gate (g) projections, through the head dim.
    t.normal(f"blk.{il}.ssm_f_a.weight", N_EMBD, KDA_HEAD_DIM)
    t.normal(f"blk.{il}.ssm_f_b.weight", KDA_HEAD_DIM, d_inner)
    t.normal(f"blk.{il}.ssm_dt.bias", d_inner)
    t.decay(f"blk.{il}.ssm_a", init.log_decay, N_HEAD)
    t.normal(f"blk.{il}.ssm_beta.weight", N_EMBD, N_HEAD)
    t.normal(f"blk.{il}.ssm_g_a.weight", N_EMBD, KDA_HEAD_DIM)
    t.normal(f"blk.{il}.ssm_g_b.weight", KDA_HEAD_DIM, d_inner)
    t.ones(f"blk.{il}.ssm_norm.weight", KDA_HEAD_DIM)
    t.normal(f"blk.{il}.attn_output.weight", d_inner, N_EMBD, std=init.out_std)


def _mla(t: _Tensors, il: int) -> None:
    """Nope-only multi-head latent attention, with k_b/v_b split out for absorption."""
    t.normal(f"blk.{il}.attn_q_a.weight", N_EMBD, MLA_Q_RANK)
    t.ones(f"blk.{il}.attn_q_a_norm.weight", MLA_Q_RANK)
    t.normal(f"blk.{il}.attn_q_b.weight", MLA_Q_RANK, N_HEAD * MLA_HEAD_DIM)
    t.normal(f"blk.{il}.attn_kv_a_mqa.weight", N_EMBD, MLA_KV_RANK)
    t.ones(f"blk.{il}.attn_kv_a_norm.weight", MLA_KV_RANK)
    t.normal(f"blk.{il}.attn_k_b.weight", MLA_HEAD_DIM, MLA_KV_RANK, N_HEAD)
    t.normal(f"blk.{il}.attn_v_b.weight", MLA_KV_RANK, MLA_HEAD_DIM, N_HEAD)
    t.normal(f"blk.{il}.attn_output.weight", N_HEAD * MLA_HEAD_DIM, N_EMBD)


def _kpool_indexer(t: _Tensors, il: int) -> None:
    """The sparse-attention indexer: it scores pooled keys and picks the top-k tokens."""
    t.normal(f"blk.{il}.indexer.attn_q_b.weight", MLA_Q_RANK, INDEXER_HEADS * INDEXER_HEAD_DIM)
    t.normal(f"blk.{il}.indexer.attn_k.weight", N_EMBD, INDEXER_HEAD_DIM)
    _layer_norm(t, f"blk.{il}.indexer.k_norm", INDEXER_HEAD_DIM)
    t.normal(f"blk.{il}.indexer.proj.weight", N_EMBD, INDEXER_HEADS)
    t.normal(f"blk.{il}.indexer_compressor_gate.weight", N_EMBD, INDEXER_HEAD_DIM)
    t.normal(f"blk.{il}.indexer_compressor_ape.weight", INDEXER_HEAD_DIM, INDEXER_KPOOL)


def _hyper_connections(t: _Tensors, il: int) -> None:
    """Per-token mixing of the residual streams around the mixer and around the FFN."""
    # pre and post weights per stream, then the stream-to-stream matrix
    mix_width = (2 + HC_STREAMS) * HC_STREAMS
    for site in ("attn", "ffn"):
        t.normal(f"blk.{il}.hc_{site}_fn.weight", HC_STREAMS * N_EMBD, mix_width)
        t.zeros(f"blk.{il}.hc_{site}_base.weight", mix_width)
        t.ones(f"blk.{il}.hc_{site}_scale.weight", 3)


def _moe(t: _Tensors, il: int) -> None:
    """Sigmoid-routed experts plus one always-on shared expert."""
    t.normal(f"blk.{il}.ffn_gate_inp.weight", N_EMBD, N_EXPERT)
    t.zeros(f"blk.{il}.exp_probs_b.bias", N_EXPERT)
    t.normal(f"blk.{il}.ffn_gate_exps.weight", N_EMBD, N_FF_EXP, N_EXPERT)
    t.normal(f"blk.{il}.ffn_up_exps.weight", N_EMBD, N_FF_EXP, N_EXPERT)
    t.normal(f"blk.{il}.ffn_down_exps.weight", N_FF_EXP, N_EMBD, N_EXPERT)
    t.normal(f"blk.{il}.ffn_gate_shexp.weight", N_EMBD, N_FF_EXP)
    t.normal(f"blk.{il}.ffn_up_shexp.weight", N_EMBD, N_FF_EXP)
    t.normal(f"blk.{il}.ffn_down_shexp.weight", N_FF_EXP, N_EMBD)


def _build_glm5_next(name: str, recipe: Recipe) -> GGUFWriter:
    t = _start_text_model(name, recipe)
    w, arch = t.writer, recipe.arch
    w.add_feed_forward_length(N_FF)
    # A zero kv-head count marks a KDA layer; an MLA layer caches one latent "head".
    w.add_head_count_kv(_per_layer(recipe, 1, "A"))
    w.add_layer_norm_eps(NORM_EPS)
    w.add_ssm_conv_kernel(CONV_KERNEL)
    w.add_kda_head_dim(KDA_HEAD_DIM)
    # Nope-only MLA: no rotary dims, and the cached key (and value) is the kv latent.
    w.add_rope_dimension_count(0)
    w.add_q_lora_rank(MLA_Q_RANK)
    w.add_kv_lora_rank(MLA_KV_RANK)
    w.add_key_length(MLA_KV_RANK)
    w.add_value_length(MLA_KV_RANK)
    w.add_key_length_mla(MLA_HEAD_DIM)
    w.add_value_length_mla(MLA_HEAD_DIM)
    w.add_leading_dense_block_count(DENSE_LEAD_LAYERS)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_shared_count(1)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_expert_weights_scale(1.0)
    w.add_expert_weights_norm(True)
    # The gguf package has no writers for these newer keys yet.
    w.add_uint32(f"{arch}.attention.indexer.head_count", INDEXER_HEADS)
    w.add_uint32(f"{arch}.attention.indexer.key_length", INDEXER_HEAD_DIM)
    w.add_uint32(f"{arch}.attention.indexer.top_k", INDEXER_TOP_K)
    w.add_uint32(f"{arch}.attention.indexer.kpool", INDEXER_KPOOL)
    # each query also sees the incomplete pool it sits in, as in the real model
    w.add_bool(f"{arch}.attention.indexer.kpool_select_tail", True)
    w.add_uint32(f"{arch}.hyper_connection.count", HC_STREAMS)
    w.add_uint32(f"{arch}.hyper_connection.sinkhorn_iterations", HC_SINKHORN_ITERS)
    w.add_float32(f"{arch}.hyper_connection.epsilon", HC_EPS)
    for il, kind in enumerate(recipe.layers):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        _hyper_connections(t, il)
        if kind == "A":
            _mla(t, il)
            _kpool_indexer(t, il)
        else:
            _kda(t, il, recipe.recurrent)
        t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        if il < DENSE_LEAD_LAYERS:
            _gated_ffn(t, il)
        else:
            _moe(t, il)
    return t.writer


_MODEL_BUILDERS: dict[str, Callable[[str, Recipe], GGUFWriter]] = {
    "llama": _build_llama,
    "granitehybrid": _build_granitehybrid,
    "nemotron_h": _build_nemotron_h,
    "qwen35": _build_qwen35,
    "glm5-next": _build_glm5_next,
}


def _lora_targets(recipe: Recipe) -> list[tuple[str, int]]:
    """The weights the adapter adapts, with their output widths."""
    if recipe.arch == "glm5-next":
        # glm5-next multiplies its attention and KDA weights without the adapter hook, so an
        # adapter there loads and changes nothing; its MLPs take one. The first layer's MLP
        # feeds every later layer, so the adapter changes the cached states too.
        return [("blk.0.ffn_gate.weight", N_FF), ("blk.0.ffn_up.weight", N_FF)]
    q_width = _attention_q_width(recipe)
    return [
        (f"blk.{il}.{target}.weight", width)
        for il, kind in enumerate(recipe.layers)
        if kind == "A"
        for target, width in (("attn_q", q_width), ("attn_v", recipe.attention.kv_heads * HEAD_DIM))
    ]


def _build_lora(recipe: Recipe) -> GGUFWriter:
    writer = GGUFWriter(None, recipe.arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", LORA_ALPHA)
    t = _Tensors(writer, recipe.seed + 1)
    for weight, width in _lora_targets(recipe):
        t.normal(f"{weight}.lora_a", N_EMBD, LORA_RANK, std=LORA_STD)
        t.normal(f"{weight}.lora_b", LORA_RANK, width, std=LORA_STD)
    return writer


def _build_mmproj(text_embd: int) -> GGUFWriter:
    """LLaVA-style CLIP tower with an MLP projector into the text model's embedding."""
    writer = GGUFWriter(None, "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", CLIP_IMAGE)
    writer.add_uint32("clip.vision.patch_size", CLIP_PATCH)
    writer.add_uint32("clip.vision.embedding_length", CLIP_WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", CLIP_FF)
    writer.add_uint32("clip.vision.block_count", CLIP_BLOCKS)
    writer.add_uint32("clip.vision.attention.head_count", CLIP_HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", text_embd)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    t = _Tensors(writer, seed=text_embd)
    n_positions = (CLIP_IMAGE // CLIP_PATCH) ** 2 + 1  # patches plus the class token
    t.normal("v.patch_embd.weight", CLIP_PATCH, CLIP_PATCH, 3, CLIP_WIDTH)
    t.normal("v.class_embd", CLIP_WIDTH)
    t.normal("v.position_embd.weight", CLIP_WIDTH, n_positions)
    _layer_norm(t, "v.pre_ln", CLIP_WIDTH)
    for il in range(CLIP_BLOCKS):
        for projection in ("attn_q", "attn_k", "attn_v", "attn_out"):
            _linear(t, f"v.blk.{il}.{projection}", CLIP_WIDTH, CLIP_WIDTH)
        _layer_norm(t, f"v.blk.{il}.ln1", CLIP_WIDTH)
        _layer_norm(t, f"v.blk.{il}.ln2", CLIP_WIDTH)
        _linear(t, f"v.blk.{il}.ffn_up", CLIP_WIDTH, CLIP_FF)
        _linear(t, f"v.blk.{il}.ffn_down", CLIP_FF, CLIP_WIDTH)
    _linear(t, "mm.0", CLIP_WIDTH, CLIP_FF)
    _linear(t, "mm.2", CLIP_FF, text_embd)
    return writer


def _linear(t: _Tensors, prefix: str, n_in: int, n_out: int) -> None:
    t.normal(f"{prefix}.weight", n_in, n_out)
    t.zeros(f"{prefix}.bias", n_out)


def _layer_norm(t: _Tensors, prefix: str, width: int) -> None:
    t.ones(f"{prefix}.weight", width)
    t.zeros(f"{prefix}.bias", width)


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


if __name__ == "__main__":
    raise SystemExit(main())
