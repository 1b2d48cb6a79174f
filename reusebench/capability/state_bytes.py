"""How many bytes the server counts for one slot's state, as its RAM prompt cache counts them: one short start of
llama-server and two slot saves, kept per binary, model file and KV cache types.

The RAM cache (``tools/server/server-task.cpp``, ``server_prompt_cache``) sizes an entry as the slot's whole state
(``llama_state_seq_get_size_ext``) plus its checkpoints' (the partial state: a window's cells, or the recurrent
state), and evicts the oldest entries above ``--cache-ram`` MiB, and above a token limit estimated from those
sizes. A slot file (``POST /slots/0?action=save``) holds the same state after its tokens, so its ``n_written``
gives the state's bytes exactly: after 1 and after 2 tokens, the fixed part and the bytes of one cell.

What a cell holds and how the fixed part splits between caches follows llama.cpp's state format
(``src/llama-kv-cache.cpp``, ``state_write``): per cell its position, its sequence count and id (12 bytes; 8 more
with multi-position RoPE, ``has_cell_ext``), and a row per layer of keys and of values; per cache a stream count,
a cell count per stream, and, where it has cells, a header (``KV_HEADER``) and 24 bytes a layer.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from reusebench.capability import cache, learned_memory
from reusebench.capability.learned_memory import PROBE_CTX, START_TIMEOUT_S, ModelLoadError
from reusebench.llama import gguf_check
from reusebench.llama.binaries import Binary
from reusebench.llama.client import ClientError
from reusebench.llama.memory_log import MULTI_POSITION_ROPE, ModelMemory
from reusebench.llama.process import ServerError
from reusebench.llama.server import Server

FILE_VERSION = 1
SEQ_HEADER = 8  # magic and sequence id, ahead of every state
FILE_HEADER = 12  # a slot file's magic, version and token count, ahead of its tokens
KV_HEADER = 16  # v_trans, n_layer, n_rot_k, n_rot_v (b11434; 8 bytes before n_rot_k and n_rot_v came)
LAYER_HEADER = 24  # a layer's key and value row headers
STREAM_COUNT = 4  # a cache's stream count, and each stream's cell count
NORMAL_TOKEN = 1  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL: the probe's prompt is one normal token, repeated
CACHE_TYPES = ("cache-type-k", "cache-type-v")  # the launch options that change a cell's bytes


@dataclass(frozen=True)
class StateBytes:
    """A slot's state in bytes: ``full`` (a RAM entry's state) and ``partial`` (a checkpoint's: a hybrid's recurrent
    state, or a window's cells)."""

    fixed: int  # the whole state's bytes beside its cells, with one stream per cache
    per_cell: int  # each cell of the full-attention cache
    per_window_cell: int  # each window cell written (those the last position still attends to)
    kv_caches: int  # caches with streams: each further stream adds a cell count
    partial_fixed: int  # a checkpoint's bytes beside its window cells
    partial_window: bool  # a checkpoint holds the window's cells (a window without recurrent state)

    def full(self, n_cells: int, n_window: int, n_streams: int) -> int:
        return (self.fixed + self.per_cell * n_cells + self.per_window_cell * n_window
                + STREAM_COUNT * (n_streams - 1) * self.kv_caches)

    def partial(self, n_window: int, n_streams: int) -> int:
        if not self.partial_window:
            return self.partial_fixed
        return self.partial_fixed + self.per_window_cell * n_window + STREAM_COUNT * (n_streams - 1)

    def to_dict(self) -> dict[str, int | bool]:
        return asdict(self)


def split(memory: ModelMemory, one: int, two: int) -> StateBytes | None:
    """The bytes of a state after one and after two tokens, split by the format; None where the layers' rows
    differ in size, so that no split is exact."""
    meta = 12 + (8 if memory.rope_type in MULTI_POSITION_ROPE else 0)
    per_position = two - one  # one more cell in every cache
    fixed = one - per_position
    full_layers = memory.attention_layers - memory.window_layers
    caches = (1 if memory.attention_layers else 0) + (1 if memory.window_layers else 0)

    def cache_fixed(layers: int) -> int:
        return STREAM_COUNT * 2 + KV_HEADER + LAYER_HEADER * layers

    if memory.window_layers:  # a full cache (perhaps of no layers, whose cells still hold their positions)
        row, rest = divmod(per_position - 2 * meta, memory.attention_layers)
        if rest:
            return None
        per_cell, per_window = meta + full_layers * row, meta + memory.window_layers * row
    else:
        per_cell, per_window = per_position, 0
    attention = (cache_fixed(full_layers) if memory.attention_layers else 0) + (
        cache_fixed(memory.window_layers) if memory.window_layers else 0)
    if memory.recurrent:  # a checkpoint is the recurrent state alone
        return StateBytes(fixed, per_cell, per_window, caches, fixed - attention, False)
    return StateBytes(fixed, per_cell, per_window, caches, SEQ_HEADER + cache_fixed(memory.window_layers),
                      bool(memory.window_layers))


def _key(binary_key: str, model: Path, cache_types: Mapping[str, str]) -> str:
    stat = model.stat()
    text = f"{binary_key}\n{model.resolve()}\n{stat.st_size}\n{stat.st_mtime_ns}\n{sorted(cache_types.items())}"
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def of_model(binary: Binary, model: Path, memory: ModelMemory, cache_types: Mapping[str, str],
             say: Callable[[str], None] = lambda _m: None) -> StateBytes | None:
    """`model`'s state bytes as `binary` counts them with these KV cache types: kept, else measured now."""
    stat = binary.path.stat()
    binary_hash = learned_memory.binary_key(binary.path, stat.st_size, stat.st_mtime_ns)  # hashed once per file
    path = cache.cache_dir() / "state-bytes" / f"{_key(binary_hash, model, cache_types)}.json"
    try:
        data = json.loads(path.read_text())
        if data.get("version") == FILE_VERSION:
            return None if data["bytes"] is None else StateBytes(**data["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    say(f"measuring {model.name}'s state in bytes (once per build, file and cache type)")
    found = probe(binary, model, memory, cache_types)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"version": FILE_VERSION, "bytes": found and found.to_dict()}, indent=2) + "\n")
    except OSError as error:
        say(f"state bytes not kept ({error.strerror}): measured again next time")
    return found


def probe(binary: Binary, model: Path, memory: ModelMemory, cache_types: Mapping[str, str]) -> StateBytes | None:
    """Two slot saves on one start of `binary`: after one token and after two."""
    token = int(gguf_check.number_array(model, "tokenizer.ggml.token_type").tolist().index(NORMAL_TOKEN))
    types = [arg for name, value in sorted(cache_types.items()) for arg in (f"--{name}", value)]
    with tempfile.TemporaryDirectory(prefix="reusebench-state-") as slots:
        args = ["-m", str(model), "-c", str(PROBE_CTX), "-np", "1", "--slot-save-path", slots, *types]
        server = Server.of(binary.path, args, call_timeout_s=START_TIMEOUT_S)
        server.process.health_timeout_s = START_TIMEOUT_S
        written = []
        try:
            with server:
                for n in (1, 2):
                    server.client.complete([token] * n, n_predict=1, n_probs=0, extra={"ignore_eos": True})
                    saved = server.client.slot_save(0, f"state-{n}.bin")
                    if int(saved["n_saved"]) != n:  # the answer's one token is not fed back: n tokens held
                        raise ValueError(f"a slot of {n} token(s) saved {saved['n_saved']}")
                    written.append(int(saved["n_written"]) - FILE_HEADER - 4 * n + SEQ_HEADER)
        except (ServerError, ClientError, KeyError, ValueError) as error:
            raise ModelLoadError(f"{model}: {binary.path.name}: the state probe failed: {error}") from error
    return split(memory, *written)
