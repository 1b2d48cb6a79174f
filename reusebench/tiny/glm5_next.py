"""glm5-next: KDA, MLA with a sparse k-pool indexer, hyper-connections and MoE."""

from __future__ import annotations

from gguf import GGUFWriter

from reusebench.tiny.layers import Tensors, gated_ffn, layer_norm, per_layer, start_text_model
from reusebench.tiny.shapes import (
    CONV_KERNEL,
    DENSE_LEAD_LAYERS,
    HC_EPS,
    HC_SINKHORN_ITERS,
    HC_STREAMS,
    INDEXER_HEAD_DIM,
    INDEXER_HEADS,
    INDEXER_KPOOL,
    INDEXER_TOP_K,
    KDA_HEAD_DIM,
    MLA_HEAD_DIM,
    MLA_KV_RANK,
    MLA_Q_RANK,
    N_EMBD,
    N_EXPERT,
    N_EXPERT_USED,
    N_FF,
    N_FF_EXP,
    N_HEAD,
    NORM_EPS,
    Recipe,
    RecurrentInit,
)


def _kda(t: Tensors, il: int, init: RecurrentInit) -> None:
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


def _mla(t: Tensors, il: int) -> None:
    """Nope-only multi-head latent attention, with k_b/v_b split out for absorption."""
    t.normal(f"blk.{il}.attn_q_a.weight", N_EMBD, MLA_Q_RANK)
    t.ones(f"blk.{il}.attn_q_a_norm.weight", MLA_Q_RANK)
    t.normal(f"blk.{il}.attn_q_b.weight", MLA_Q_RANK, N_HEAD * MLA_HEAD_DIM)
    t.normal(f"blk.{il}.attn_kv_a_mqa.weight", N_EMBD, MLA_KV_RANK)
    t.ones(f"blk.{il}.attn_kv_a_norm.weight", MLA_KV_RANK)
    t.normal(f"blk.{il}.attn_k_b.weight", MLA_HEAD_DIM, MLA_KV_RANK, N_HEAD)
    t.normal(f"blk.{il}.attn_v_b.weight", MLA_KV_RANK, MLA_HEAD_DIM, N_HEAD)
    t.normal(f"blk.{il}.attn_output.weight", N_HEAD * MLA_HEAD_DIM, N_EMBD)


def _kpool_indexer(t: Tensors, il: int) -> None:
    """The sparse-attention indexer: it scores pooled keys and picks the top-k tokens."""
    t.normal(f"blk.{il}.indexer.attn_q_b.weight", MLA_Q_RANK, INDEXER_HEADS * INDEXER_HEAD_DIM)
    t.normal(f"blk.{il}.indexer.attn_k.weight", N_EMBD, INDEXER_HEAD_DIM)
    layer_norm(t, f"blk.{il}.indexer.k_norm", INDEXER_HEAD_DIM)
    t.normal(f"blk.{il}.indexer.proj.weight", N_EMBD, INDEXER_HEADS)
    t.normal(f"blk.{il}.indexer_compressor_gate.weight", N_EMBD, INDEXER_HEAD_DIM)
    t.normal(f"blk.{il}.indexer_compressor_ape.weight", INDEXER_HEAD_DIM, INDEXER_KPOOL)


def _hyper_connections(t: Tensors, il: int) -> None:
    """Per-token mixing of the residual streams around the mixer and around the FFN."""
    # pre and post weights per stream, then the stream-to-stream matrix
    mix_width = (2 + HC_STREAMS) * HC_STREAMS
    for site in ("attn", "ffn"):
        t.normal(f"blk.{il}.hc_{site}_fn.weight", HC_STREAMS * N_EMBD, mix_width)
        t.zeros(f"blk.{il}.hc_{site}_base.weight", mix_width)
        t.ones(f"blk.{il}.hc_{site}_scale.weight", 3)


def _moe(t: Tensors, il: int) -> None:
    """Sigmoid-routed experts plus one always-on shared expert."""
    t.normal(f"blk.{il}.ffn_gate_inp.weight", N_EMBD, N_EXPERT)
    t.zeros(f"blk.{il}.exp_probs_b.bias", N_EXPERT)
    t.normal(f"blk.{il}.ffn_gate_exps.weight", N_EMBD, N_FF_EXP, N_EXPERT)
    t.normal(f"blk.{il}.ffn_up_exps.weight", N_EMBD, N_FF_EXP, N_EXPERT)
    t.normal(f"blk.{il}.ffn_down_exps.weight", N_FF_EXP, N_EMBD, N_EXPERT)
    t.normal(f"blk.{il}.ffn_gate_shexp.weight", N_EMBD, N_FF_EXP)
    t.normal(f"blk.{il}.ffn_up_shexp.weight", N_EMBD, N_FF_EXP)
    t.normal(f"blk.{il}.ffn_down_shexp.weight", N_FF_EXP, N_EMBD)


def build_glm5_next(name: str, recipe: Recipe) -> GGUFWriter:
    t = start_text_model(name, recipe)
    w, arch = t.writer, recipe.arch
    w.add_feed_forward_length(N_FF)
    # A zero kv-head count marks a KDA layer; an MLA layer caches one latent "head".
    w.add_head_count_kv(per_layer(recipe, 1, "A"))
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
            gated_ffn(t, il)
        else:
            _moe(t, il)
    return t.writer
