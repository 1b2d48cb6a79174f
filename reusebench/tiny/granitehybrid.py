"""granitehybrid: Mamba2 and attention layers."""

from __future__ import annotations

import math

from gguf import GGUFWriter

from reusebench.tiny.layers import add_mamba2_metadata, mixer_then_ffn_layers, per_layer, start_text_model
from reusebench.tiny.shapes import HEAD_DIM, N_FF, Recipe


def build_granitehybrid(name: str, recipe: Recipe) -> GGUFWriter:
    t = start_text_model(name, recipe)
    t.writer.add_feed_forward_length(N_FF)
    # A zero kv-head count is what marks a layer as recurrent.
    t.writer.add_head_count_kv(per_layer(recipe, recipe.attention.kv_heads, "A"))
    t.writer.add_rope_dimension_count(HEAD_DIM)
    # Granite's scalars, set to the identity so the model is a plain hybrid.
    t.writer.add_embedding_scale(1.0)
    t.writer.add_residual_scale(1.0)
    t.writer.add_logit_scale(1.0)
    t.writer.add_attention_scale(1.0 / math.sqrt(HEAD_DIM))
    add_mamba2_metadata(t.writer)
    mixer_then_ffn_layers(t, recipe)
    return t.writer
