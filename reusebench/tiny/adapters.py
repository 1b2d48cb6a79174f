"""What loads beside a text model: a rank-4 LoRA adapter and a tiny CLIP projector (--mmproj)."""

from __future__ import annotations

from gguf import GGUFWriter

from reusebench.tiny.layers import Tensors, attention_q_width, layer_norm, linear
from reusebench.tiny.shapes import (
    CLIP_BLOCKS,
    CLIP_FF,
    CLIP_HEADS,
    CLIP_IMAGE,
    CLIP_PATCH,
    CLIP_WIDTH,
    HEAD_DIM,
    LORA_ALPHA,
    LORA_RANK,
    LORA_STD,
    N_EMBD,
    N_FF,
    Recipe,
)


def lora_targets(recipe: Recipe) -> list[tuple[str, int]]:
    """The weights the adapter adapts, with their output widths."""
    if recipe.arch == "glm5-next":
        # glm5-next multiplies its attention and KDA weights without the adapter hook, so an
        # adapter there loads and changes nothing; its MLPs take one. The first layer's MLP
        # feeds every later layer, so the adapter changes the cached states too.
        return [("blk.0.ffn_gate.weight", N_FF), ("blk.0.ffn_up.weight", N_FF)]
    q_width = attention_q_width(recipe)
    return [
        (f"blk.{il}.{target}.weight", width)
        for il, kind in enumerate(recipe.layers)
        if kind in "AW"
        for target, width in (("attn_q", q_width), ("attn_v", recipe.attention.kv_heads * HEAD_DIM))
    ]


def build_lora(recipe: Recipe) -> GGUFWriter:
    writer = GGUFWriter(None, recipe.arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", LORA_ALPHA)
    t = Tensors(writer, recipe.seed + 1)
    for weight, width in lora_targets(recipe):
        t.normal(f"{weight}.lora_a", N_EMBD, LORA_RANK, std=LORA_STD)
        t.normal(f"{weight}.lora_b", LORA_RANK, width, std=LORA_STD)
    return writer


def build_mmproj(text_embd: int) -> GGUFWriter:
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

    t = Tensors(writer, seed=text_embd)
    n_positions = (CLIP_IMAGE // CLIP_PATCH) ** 2 + 1  # patches plus the class token
    t.normal("v.patch_embd.weight", CLIP_PATCH, CLIP_PATCH, 3, CLIP_WIDTH)
    t.normal("v.class_embd", CLIP_WIDTH)
    t.normal("v.position_embd.weight", CLIP_WIDTH, n_positions)
    layer_norm(t, "v.pre_ln", CLIP_WIDTH)
    for il in range(CLIP_BLOCKS):
        for projection in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(t, f"v.blk.{il}.{projection}", CLIP_WIDTH, CLIP_WIDTH)
        layer_norm(t, f"v.blk.{il}.ln1", CLIP_WIDTH)
        layer_norm(t, f"v.blk.{il}.ln2", CLIP_WIDTH)
        linear(t, f"v.blk.{il}.ffn_up", CLIP_WIDTH, CLIP_FF)
        linear(t, f"v.blk.{il}.ffn_down", CLIP_FF, CLIP_WIDTH)
    linear(t, "mm.0", CLIP_WIDTH, CLIP_FF)
    linear(t, "mm.2", CLIP_FF, text_embd)
    return writer
