"""gemma3: sliding-window attention layers with a global one every sixth (the Gemma 3 class)."""

from __future__ import annotations

from gguf import GGUFWriter

from reusebench.tiny.layers import attention, gated_ffn, start_text_model
from reusebench.tiny.shapes import HEAD_DIM, N_EMBD, N_FF, Recipe


def build_gemma3(name: str, recipe: Recipe) -> GGUFWriter:
    # llama.cpp reads the window from `gemma3.attention.sliding_window` and puts a global layer at every sixth
    # (its built-in pattern, which real Gemma 3 files rely on too): W in the recipe where il % 6 < 5, A elsewhere.
    assert recipe.window > 0 and all((kind == "W") == (il % 6 < 5) for il, kind in enumerate(recipe.layers))
    t = start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    t.writer.add_head_count_kv(recipe.attention.kv_heads)
    t.writer.add_key_length(HEAD_DIM)
    t.writer.add_value_length(HEAD_DIM)
    t.writer.add_sliding_window(recipe.window)
    for il in range(len(recipe.layers)):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        attention(t, il, recipe)
        t.ones(f"blk.{il}.attn_q_norm.weight", HEAD_DIM)
        t.ones(f"blk.{il}.attn_k_norm.weight", HEAD_DIM)
        t.ones(f"blk.{il}.post_attention_norm.weight", N_EMBD)
        t.ones(f"blk.{il}.ffn_norm.weight", N_EMBD)
        gated_ffn(t, il)
        t.ones(f"blk.{il}.post_ffw_norm.weight", N_EMBD)
    return t.writer
