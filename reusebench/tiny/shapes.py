"""The sizes, vocabulary, chat template and recipe types every tiny model is made from."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gguf import TokenType

from reusebench.llama.facts import CHATML_TEMPLATE

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
    # One letter per layer: A attention, W sliding-window attention, M Mamba2, D Gated DeltaNet, K KDA, F MLP only,
    # N a multi-token-prediction (NextN) block after the trunk (qwen35 only: --spec-type draft-mtp drafts with it).
    layers: str
    seed: int
    recurrent: RecurrentInit = DEFAULT_RECURRENT
    attention: AttentionShape = AttentionShape()
    window: int = 0  # the sliding window of the W layers, in tokens
