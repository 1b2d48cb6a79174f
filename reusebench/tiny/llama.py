"""llama: pure attention, the control."""

from __future__ import annotations

from gguf import GGUFWriter

from reusebench.tiny.layers import mixer_then_ffn_layers, start_text_model
from reusebench.tiny.shapes import HEAD_DIM, N_FF, Recipe


def build_llama(name: str, recipe: Recipe) -> GGUFWriter:
    t = start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    t.writer.add_head_count_kv(recipe.attention.kv_heads)
    t.writer.add_rope_dimension_count(HEAD_DIM)
    mixer_then_ffn_layers(t, recipe)
    return t.writer
