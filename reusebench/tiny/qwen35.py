"""qwen35: Gated DeltaNet and attention layers (the Qwen3.5 class report A measures)."""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter

from reusebench.tiny.layers import Tensors, attention, gated_ffn, start_text_model
from reusebench.tiny.shapes import (
    CONV_KERNEL,
    DELTA_HEAD_DIM,
    DELTA_K_HEADS,
    DELTA_V_HEADS,
    HEAD_DIM,
    N_EMBD,
    N_FF,
    Recipe,
)


def build_qwen35(name: str, recipe: Recipe) -> GGUFWriter:
    t = start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    t.writer.add_head_count_kv(recipe.attention.kv_heads)
    t.writer.add_key_length(HEAD_DIM)
    t.writer.add_value_length(HEAD_DIM)
    t.writer.add_full_attention_interval(recipe.layers.index("A") + 1)
    # NextN blocks follow the trunk and count in the block count (src/models/qwen35.cpp load_arch_tensors).
    if "N" in recipe.layers:
        t.writer.add_nextn_predict_layers(recipe.layers.count("N"))
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
        if kind in "AN":
            attention(t, il, recipe)
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
        gated_ffn(t, il)
        if kind == "N":
            nextn_head(t, il)
    return t.writer


def nextn_head(t: Tensors, il: int) -> None:
    """What makes a full-attention block a multi-token-prediction head: the projection of the next token's
    embedding joined with the trunk's hidden state (eh_proj) and their norms; the head shares the trunk's embedding
    and output (the optional nextn.embed_tokens and shared_head tensors are left out).

    The projection passes the embedding through and mixes in a little of the hidden state. The trunk's small random
    weights leave its residual stream close to the current token's embedding, so the head drafts about what the
    trunk would predict one token later: about a third of the drafts are accepted and the rest rejected (measured on
    b11434), so rejections that roll the recurrent state back come between accepted drafts. A random projection
    drafts nothing the target accepts; the embedding alone, nearly everything.
    """
    eh_proj = np.zeros((N_EMBD, 2 * N_EMBD), dtype=np.float32)  # numpy order: (output, [embedding | hidden])
    eh_proj[:, :N_EMBD] = np.eye(N_EMBD, dtype=np.float32)
    eh_proj[:, N_EMBD:] = t.random(N_EMBD, N_EMBD, std=0.03)
    t.add(f"blk.{il}.nextn.eh_proj.weight", eh_proj)
    t.ones(f"blk.{il}.nextn.enorm.weight", N_EMBD)
    t.ones(f"blk.{il}.nextn.hnorm.weight", N_EMBD)
