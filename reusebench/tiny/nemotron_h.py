"""nemotron_h: Mamba2, attention and MLP-only layers."""

from __future__ import annotations

from gguf import GGUFWriter

from reusebench.tiny.layers import add_mamba2_metadata, attention, mamba2, per_layer, start_text_model
from reusebench.tiny.shapes import HEAD_DIM, N_EMBD, N_FF, NORM_EPS, Recipe


def build_nemotron_h(name: str, recipe: Recipe) -> GGUFWriter:
    t = start_text_model(name, recipe)
    # Layers with neither kv heads nor an MLP are the recurrent ones.
    t.writer.add_feed_forward_length(per_layer(recipe, N_FF, "F"))
    t.writer.add_head_count_kv(per_layer(recipe, recipe.attention.kv_heads, "A"))
    t.writer.add_key_length(HEAD_DIM)
    t.writer.add_value_length(HEAD_DIM)
    t.writer.add_layer_norm_eps(NORM_EPS)
    add_mamba2_metadata(t.writer)
    for il, kind in enumerate(recipe.layers):
        t.ones(f"blk.{il}.attn_norm.weight", N_EMBD)
        if kind == "A":
            attention(t, il, recipe)
        elif kind == "M":
            mamba2(t, il, recipe.recurrent)
        else:
            t.normal(f"blk.{il}.ffn_up.weight", N_EMBD, N_FF)
            t.normal(f"blk.{il}.ffn_down.weight", N_FF, N_EMBD)
    return t.writer
