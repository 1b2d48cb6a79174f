"""The building blocks every architecture shares: the writer with its seeded tensors, the tokenizer and
global tensors, attention, MLP and Mamba2 layers."""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter, TokenType

from reusebench.tiny.shapes import (
    BOS_ID,
    CHAT_TEMPLATE,
    CONTEXT_LENGTH,
    CONV_KERNEL,
    EOS_ID,
    FIRST_TEXT_TOKEN_ID,
    HEAD_DIM,
    MAMBA_GROUPS,
    MAMBA_HEADS,
    MAMBA_INNER,
    MAMBA_STATE,
    N_EMBD,
    N_FF,
    NORM_EPS,
    ROPE_FREQ_BASE,
    SPECIAL_TOKENS,
    UNK_ID,
    WEIGHT_STD,
    WORDS,
    Recipe,
    RecurrentInit,
)


class Tensors:
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


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style vocab in which every " word" of WORDS is exactly one token."""
    tokens = [text for text, _ in SPECIAL_TOKENS] + [f"<0x{byte:02X}>" for byte in range(256)]
    types = [int(kind) for _, kind in SPECIAL_TOKENS] + [int(TokenType.BYTE)] * 256
    pieces = ["▁"] + [chr(code) for code in range(0x21, 0x7F)]
    # Every prefix must exist too: SentencePiece merges bigrams one character at a time.
    pieces += [f"▁{word[:end]}" for word in WORDS for end in range(1, len(word) + 1)]
    pieces = list(dict.fromkeys(pieces))
    scores = [0.0] * len(tokens) + [float(len(piece)) for piece in pieces]
    return tokens + pieces, scores, types + [int(TokenType.NORMAL)] * len(pieces)


def add_tokenizer(writer: GGUFWriter) -> list[str]:
    """The tiny vocabulary, its special tokens and the ChatML template; returns the token list."""
    tokens, scores, types = vocabulary()
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
    return tokens


def start_text_model(name: str, recipe: Recipe) -> Tensors:
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

    tokens = add_tokenizer(writer)

    tensors = Tensors(writer, recipe.seed)
    tensors.normal("token_embd.weight", N_EMBD, len(tokens), std=1.0)
    tensors.ones("output_norm.weight", N_EMBD)
    output = tensors.random(N_EMBD, len(tokens))
    output[:FIRST_TEXT_TOKEN_ID] = 0.0
    tensors.add("output.weight", output)
    return tensors


def attention_q_width(recipe: Recipe) -> int:
    # qwen35's gated attention projects query and gate together.
    width = recipe.attention.heads * HEAD_DIM
    return 2 * width if recipe.arch == "qwen35" else width


def attention(t: Tensors, il: int, recipe: Recipe) -> None:
    kv_width = recipe.attention.kv_heads * HEAD_DIM
    t.normal(f"blk.{il}.attn_q.weight", N_EMBD, attention_q_width(recipe))
    t.normal(f"blk.{il}.attn_k.weight", N_EMBD, kv_width)
    t.normal(f"blk.{il}.attn_v.weight", N_EMBD, kv_width)
    t.normal(f"blk.{il}.attn_output.weight", recipe.attention.heads * HEAD_DIM, N_EMBD)


def gated_ffn(t: Tensors, il: int) -> None:
    t.normal(f"blk.{il}.ffn_gate.weight", N_EMBD, N_FF)
    t.normal(f"blk.{il}.ffn_up.weight", N_EMBD, N_FF)
    t.normal(f"blk.{il}.ffn_down.weight", N_FF, N_EMBD)


def mamba2(t: Tensors, il: int, init: RecurrentInit) -> None:
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


def add_mamba2_metadata(writer: GGUFWriter) -> None:
    writer.add_ssm_conv_kernel(CONV_KERNEL)
    writer.add_ssm_inner_size(MAMBA_INNER)
    writer.add_ssm_state_size(MAMBA_STATE)
    writer.add_ssm_time_step_rank(MAMBA_HEADS)
    writer.add_ssm_group_count(MAMBA_GROUPS)


def per_layer(recipe: Recipe, value: int, kinds: str) -> list[int]:
    """A per-layer metadata array: `value` on layers whose kind is in `kinds`, else 0."""
    return [value if kind in kinds else 0 for kind in recipe.layers]


def mixer_then_ffn_layers(t: Tensors, recipe: Recipe) -> None:
    """llama-style blocks: norm, attention or Mamba2, norm, gated MLP."""
    for il, kind in enumerate(recipe.layers):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        if kind == "A":
            attention(t, il, recipe)
        else:
            mamba2(t, il, recipe.recurrent)
        t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        gated_ffn(t, il)


def linear(t: Tensors, prefix: str, n_in: int, n_out: int) -> None:
    t.normal(f"{prefix}.weight", n_in, n_out)
    t.zeros(f"{prefix}.bias", n_out)


def layer_norm(t: Tensors, prefix: str, width: int) -> None:
    t.ones(f"{prefix}.weight", width)
    t.zeros(f"{prefix}.bias", width)
