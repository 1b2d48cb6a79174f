"""Read llama-server's log: its grammar as typed events, and the scrubber that keeps only lines of that grammar with
numbers in them (per-request causes: ``causes``; what start-up applied: ``startup``; reading a growing log:
``log_tail``).

The server is run at ``-lv 4`` so that the TRC lines (checkpoints, RAM cache, LoRA clears) are visible.
Those lines carry only positions, sizes and ratios. Build 7e4c0a9 printed no prompt text at ``-lv 4`` in any
captured scenario, but ``-lv 5``/``-v`` (DBG) does (the ``launching slot`` JSON with ``"prompt"``, ``next token``
pieces, ``streamed chunk`` bodies) and report B's build did at TRACE; so the kept log is filtered through an
allowlist (:func:`scrub_line`): a line survives only if it is one of the known, numbers-only lines below.

Two input formats are accepted, line by line:

* plain text on stderr (every build): ``0.01.234.567 I slot launch_slot_: id  0 | task 5 | processing task``;
  the timestamp and level letter are optional (``--log-prefix``/``--log-timestamps`` off);
* ``--log-jsonl`` objects on stdout (b11434 and later): ``{"type":"log","time":..,"level":"info","msg":".."}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TextIO

__all__ = [
    "EVENT_PATTERNS",
    "Event",
    "filter_stream",
    "parse_lines",
    "scrub_line",
]

# ---------------------------------------------------------------------------------------------------------------
# Event table. Each entry is (kind, pattern). A pattern is a regular expression for the whole message (after the
# optional timestamp/level prefix and the ``slot func: id N | task M |`` / ``srv  func:`` prefix), in which
# ``{name}`` stands for an integer field and ``{name:f}`` for a decimal one. Literal spaces match runs of spaces
# because the server pads numbers (``%10.2f``). Patterns are full matches, so a line with anything else on it
# (such as text) is neither an event nor kept by the scrubber.
# ---------------------------------------------------------------------------------------------------------------

EVENT_PATTERNS: tuple[tuple[str, str], ...] = (
    # slot selection (INF) and launch; printed with task -1, before the task id is known
    ("slot_skipped_empty", r"- skipping, slot is empty"),
    ("slot_similarity_checked", r"- checking sim = {f_sim:f} \({lcp}/{n_tokens}\) > {threshold:f}"),
    ("slot_selected_by_id", r"selected slot by id \({requested}\)"),
    ("slot_selected_by_lcp",  # "sim_best" in b10159 and older, "f_sim_best" by b10218
     r"selected slot by LCP similarity, (?:f_)?sim_best = {f_sim:f} \(> {threshold:f} thold\), f_keep = {f_keep:f}"),
    ("slot_selected_by_lru", r"selected slot by LRU, t_last = {t_last}"),
    ("lora_cache_cleared", r"clearing cache for lora change\. {loras_before} loras -> {loras_after} loras"),
    ("processing_task", r"processing task, is_child = {is_child}"),
    # reuse decisions on the slot (TRC)
    ("new_prompt", r"new prompt, n_ctx_slot = {n_ctx_slot}, n_keep = {n_keep}, task\.n_tokens = {n_tokens}"),
    ("cache_reuse_chunk",
     r"reusing chunk with size {size}, shifting KV cache \[{from_start}, {from_end}\) -> \[{to_start}, {to_end}\)"),
    ("cache_reuse_ignored", r"cache reuse is not supported - ignoring n_cache_reuse = {n_cache_reuse}"),
    ("checkpoint_checked", r"checking checkpoint with \[{pos_min}, {pos_max}\] against {pos_next}\.\.\."),
    ("checkpoint_restored",
     r"restored context checkpoint \(pos_min = {pos_min}, pos_max = {pos_max}, n_tokens = {n_tokens}, "
     r"n_past = {n_past}, size = {size_mib:f} MiB\)"),
    ("forced_full_reprocess",
     r"forcing full prompt re-processing due to lack of cache data \(likely due to SWA or hybrid/recurrent memory, "
     r"see https://[\w./#?=&-]+\)"),
    ("checkpoint_erased_invalidated",
     r"erased invalidated context checkpoint \(pos_min = {pos_min}, pos_max = {pos_max}, n_tokens = {n_tokens}, "
     r"n_swa = {n_swa}(?:, pos_next = {pos_next})?, size = {size_mib:f} MiB\)"),
    ("need_one_token",
     r"need to evaluate at least 1 token for each active slot \(n_past = {n_past}, task\.n_tokens\(\) = {n_tokens}\)"),
    ("n_past_set", r"n_past was set to {n_past}"),
    ("cached_tokens", r"(?:cached )?n_tokens = {n_tokens}, memory_seq_rm \[{seq_rm_from}, end\)"),  # "cached" since b9246
    ("checkpoint_created",
     r"created context checkpoint {index} of {max} \(pos_min = {pos_min}, pos_max = {pos_max}, "
     r"n_tokens = {n_tokens}, size = {size_mib:f} MiB\)"),
    ("checkpoint_erased_too_close",
     r"erasing context checkpoint too close to an earlier one \(pos_min = {pos_min}, pos_max = {pos_max}, "
     r"n_tokens = {n_tokens}, size = {size_mib:f} MiB\)"),
    ("checkpoint_superseded", r"superseding context checkpoint at n_tokens = {n_tokens}"),
    ("checkpoint_erased_old",
     r"erasing old context checkpoint \(pos_min = {pos_min}, pos_max = {pos_max}, n_tokens = {n_tokens}, "
     r"size = {size_mib:f} MiB\)"),
    ("sampler_initialized", r"init sampler, took {ms:f} ms, tokens: text = {n_text}, total = {n_total}"),
    ("prompt_eval",
     r"prompt eval time = {ms:f} ms / {n_tokens} tokens \( {ms_per_token:f} ms per token, "
     r"{tokens_per_second:f} tokens per second\)"),
    ("generation_eval",
     r"eval time = {ms:f} ms / {n_tokens} tokens \( {ms_per_token:f} ms per token, "
     r"{tokens_per_second:f} tokens per second\)"),
    ("total_time", r"total time = {ms:f} ms / {n_tokens} tokens"),
    ("graphs_reused", r"graphs reused = {n_graphs}"),
    ("stop_processing", r"stop processing: n_tokens = {n_tokens}, truncated = {truncated}"),
    ("all_slots_idle", r"all slots are idle"),
    ("prompt_cleared", r"clearing prompt with {n_tokens} tokens"),
    # images (mtmd chunks): the encode goes out with the slot's prefix, the projected tokens' decode without
    ("mtmd_encoding", r"encoding mtmd batch from idx = {idx}, n_chunks = {n_chunks}"),
    ("image_decoding", r"decoding image batch {batch}/{n_batches}, n_tokens_batch = {n_tokens}"),
    ("image_decoded", r"image decoded \(batch {batch}/{n_batches}\) in {ms} ms"),
    # speculative decoding, one line per verified draft with LLAMA_TRACE set (server-context.cpp 4283-4311): a draft
    # rolled back to a speculative checkpoint is then replayed, and its replay logs a line of its own
    ("draft_restored_checkpoint", r"accepted {accepted}/{drafted} draft tokens \(restore checkpoint\)"),
    ("draft_verified", r"accepted {accepted}/{drafted} draft tokens"),
    ("slot_purged", r"purging slot {purged_slot} with {n_tokens} tokens"),
    ("kv_cache_full_retry",
     r"failed to find free space in the KV cache, retrying with smaller batch size, off = {off}, n_batch = {n_batch}, "
     r"ret = {ret}"),
    ("kv_cache_no_memory_slot", r"decode: failed to find a memory slot for batch of size {n_tokens}"),
    # RAM prompt cache (TRC; evictions and oversize entries are WRN)
    ("ram_cache_updating", r"updating prompt cache"),
    ("ram_prompt_saved",
     r"- saving prompt with length {n_tokens}, total state size = {size_mib:f} MiB(?: \(draft: {draft_mib:f} MiB\))?"),
    # "sim" in b10159 and older, "f_sim" by b10218 (the candidate lines came with it)
    ("ram_lookup", r"- looking for better prompt, base f_keep = {f_keep:f}, (?:f_)?sim = {f_sim:f}"),
    ("ram_candidate", r"- prompt with length {n_tokens}, lcp = {lcp}, f_keep = {f_keep:f}, f_sim = {f_sim:f}"),
    ("ram_prompt_found", r"- found better prompt with f_keep = {f_keep:f}, (?:f_)?sim = {f_sim:f}"),
    ("ram_entry_evicted_for_room",
     r"- making room for prompt cache entry, removing oldest entry \(size = {size_mib:f} MiB\)"),
    ("ram_entry_evicted_over_limit", r"- cache size limit reached, removing oldest entry \(size = {size_mib:f} MiB\)"),
    ("ram_entry_evicted_over_token_limit",
     r"- cache token limit \({limit_tokens}, est: {est_tokens}\) reached, removing oldest entry \(size = {size_mib:f} MiB\)"),
    ("ram_prompt_too_large",
     r"- prompt state size {size_mib:f} MiB exceeds cache size limit {limit_mib:f} MiB, skipping"),
    ("ram_cache_state",
     r"- cache state: {n_prompts} prompts, {size_mib:f} MiB \(limits: {limit_mib:f} MiB, {limit_tokens} tokens, "
     r"{est_tokens} est\)"),
    ("ram_cache_entry", r"- prompt 0x[0-9a-f]+: {n_tokens} tokens, checkpoints: {n_checkpoints}, {size_mib:f} MiB"),
    ("ram_cache_update_took", r"prompt cache update took {ms:f} ms"),
    ("idle_slot_saved", r"saving idle slot to prompt cache"),
    ("lora_adapter_set", r"set lora adapter idx={adapter} scale={scale:f}"),
    # sleep (INF; the queue and the server each print one line)
    ("sleep_entering", r"(?:server is )?entering sleeping state"),
    ("sleep_exiting", r"(?:server is )?exiting sleeping state"),
    # startup: the configuration as the server really applied it
    ("n_parallel_auto", r"n_parallel is set to auto, using n_parallel = {n_parallel} and kv_unified = (?P<kv_unified>true|false)"),
    ("multimodal_loaded", r"loaded multimodal model, '(?P<path>[^']+)'"),
    ("cache_reuse_unsupported",
     r"cache_reuse is not supported by (?P<reason>multimodal|this context), it will be disabled"),
    ("ctx_shift_unsupported", r"ctx_shift is not supported by (?P<reason>multimodal|this context), it will be disabled"),
    ("swa_full_unsupported", r"swa_full is not supported by this model, it will be disabled"),
    ("seq_rm_support", r"the context (?P<support>does not support|supports bounded) partial sequence removal"),
    ("slots_initialized",
     r"initializing, n_slots = {n_slots}, n_ctx_slot = {n_ctx_slot}, kv_unified = '(?P<kv_unified>true|false)'"),
    ("slot_created", r"new slot, n_ctx = {n_ctx}"),
    ("prompt_cache_enabled", r"prompt cache is enabled, size limit: (?:{limit_mib} MiB|(?P<unlimited>no limit))"),
    ("prompt_cache_disabled", r"prompt cache is disabled - use `--cache-ram N` to enable it"),
    ("checkpoints_enabled", r"context checkpoints enabled, max = {max}, min spacing = {min_spacing}"),
    ("checkpoints_disabled", r"context checkpoints disabled"),
    ("cache_idle_slots_need_cache_ram", r"--cache-idle-slots requires --cache-ram, disabling"),
    ("idle_slots_policy", r"idle slots will be saved to prompt cache(?P<and_cleared> and cleared)? upon starting a new task"),
    ("model_loaded", r"model loaded"),
    ("server_listening", r"listening on http://(?:\d+\.\d+\.\d+\.\d+|\[[0-9a-f:]+\]|localhost):{port}"),
)

_PLACEHOLDER = re.compile(r"\{(\w+)(:f)?\}")


def _compile(pattern: str) -> re.Pattern[str]:
    # padded numbers: "%10.2f" prints leading spaces, so every number and every literal space allows a run of them
    def number(m: re.Match[str]) -> str:
        body = r"-?\d+\.\d+" if m.group(2) else r"-?\d+"
        return rf" *(?P<{m.group(1)}>{body})"

    return re.compile(_PLACEHOLDER.sub(number, pattern.replace(" ", " +")))


_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, _compile(p)) for kind, p in EVENT_PATTERNS)
_LITERAL_WORD = re.compile(r"[^\s\\(){}\[\]?*+.^$|]+(?= |$)")


def _by_first_word() -> tuple[dict[str, tuple[tuple[str, re.Pattern[str]], ...]], tuple[tuple[str, re.Pattern[str]], ...]]:
    """The patterns a message may match, by its first word, in the table's order: those that begin with that word
    literally, and those that begin otherwise ("(?:cached )?n_tokens"). A -lv 4 launch lists the whole RAM cache, so
    a busy log is mostly listing lines, and each would try every pattern before its own."""
    first = [m.group(0) if (m := _LITERAL_WORD.match(p)) else None for _, p in EVENT_PATTERNS]
    anywhere = tuple(c for c, word in zip(_COMPILED, first) if word is None)
    table = {word: tuple(c for c, w in zip(_COMPILED, first) if w in (word, None)) for word in first if word}
    return table, anywhere


_BY_FIRST_WORD, _ANY_FIRST_WORD = _by_first_word()
_INTEGER = re.compile(r"-?\d+")
_DECIMAL = re.compile(r"-?\d+\.\d+")

# "0.01.234.567 I " (timestamp and level letter are each optional), then the slot or srv prefix
_LINE = re.compile(
    r"(?:(?P<stamp>\d+\.\d{2}\.\d{3}\.\d{3}) )?(?:(?P<letter>[IWED]) )?"
    r"(?:slot (?P<slot_func>[^:|]{1,12}): id +(?P<slot>-?\d+) \| task (?P<task>-?\d+) \| "
    r"|(?P<module>srv|que|res|cmn|spec) +(?P<func>[^:|]{1,12}): )?"
    r"(?P<msg>.*)"
)
_ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")  # --log-colors on
_LEVEL_BY_LETTER = {"I": "info", "W": "warn", "E": "error", "D": "debug"}


@dataclass(frozen=True)
class Event:
    """One recognised log line. ``fields`` holds the numbers (and the few fixed words) it carries."""

    kind: str
    level: str | None  # "info" | "warn" | "error" | "debug"; None when the log has no level prefix
    slot: int | None
    task: int | None
    fields: Mapping[str, int | float | str]
    line: str  # the message without prefix; only numbers-only lines become events, so it is safe to keep
    at_s: float | None = None  # seconds since the server started (--log-timestamps), None without a timestamp


def _seconds(stamp: str | None) -> float | None:
    """"0.01.234.567" (minutes, seconds, milliseconds, microseconds) in seconds."""
    if stamp is None:
        return None
    minutes, seconds, millis, micros = (int(p) for p in stamp.split("."))
    return minutes * 60 + seconds + millis / 1e3 + micros / 1e6


def _typed(value: str) -> int | float | str:
    if _INTEGER.fullmatch(value):
        return int(value)
    if _DECIMAL.fullmatch(value):
        return float(value)
    return value


def _match_message(message: str, skip: frozenset[str] = frozenset()) -> tuple[str, dict[str, int | float | str]] | None:
    for kind, regex in _BY_FIRST_WORD.get(message.partition(" ")[0], _ANY_FIRST_WORD):
        m = regex.fullmatch(message)
        if m:
            return None if kind in skip else (kind, {k: _typed(v) for k, v in m.groupdict().items() if v is not None})
    return None


def _split_jsonl(line: str) -> tuple[str | None, list[str]] | None:
    """(level, message lines) of a ``--log-jsonl`` object, or None when the line is not one."""
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("type") != "log" or not isinstance(obj.get("msg"), str):
        return None
    level = obj.get("level") if isinstance(obj.get("level"), str) else None
    return level, obj["msg"].splitlines()


def parse_lines(lines: Iterable[str], skip: frozenset[str] = frozenset()) -> list[Event]:
    """Events in order, but none of the kinds in `skip`. A line without a slot prefix (the second line of a
    multi-line message, such as the ``prompt eval time`` timing block) inherits the slot and task of the last
    prefixed line."""
    events: list[Event] = []
    slot: int | None = None
    task: int | None = None
    for raw in lines:
        raw = _ANSI_COLOR.sub("", raw.rstrip("\r\n"))
        jsonl = _split_jsonl(raw)
        level, texts = jsonl if jsonl else (None, [raw])
        for text in texts:
            m = _LINE.fullmatch(text)
            assert m is not None  # the message group matches anything
            if m.group("slot") is not None:
                slot, task = int(m.group("slot")), int(m.group("task"))
            elif m.group("letter") or m.group("module"):
                slot = task = None
            found = _match_message(m.group("msg").strip(), skip)
            if found:
                kind, values = found
                line_level = level or _LEVEL_BY_LETTER.get(m.group("letter") or "")
                events.append(Event(kind, line_level, slot, task, values, m.group("msg").strip(),
                                    _seconds(m.group("stamp"))))
    return events


# ---------------------------------------------------------------------------------------------------------------
# Privacy: the kept log
# ---------------------------------------------------------------------------------------------------------------

# Startup/system lines that are safe besides the events: every field a number or a fixed word. A prompt can put any
# line into the log at -lv 9 (its continuation lines carry no prefix), so a pattern that let a word through would
# let the prompt through.
_CONTEXT_KEYS = ("n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "causal_attn", "flash_attn", "freq_base", "freq_scale",
                 "kv_unified", "n_outputs_max", "n_outputs_max_per_seq", "n_rs_seq", "n_seq_max")
_INFO_KEYS = (
    "n_ctx_train", "n_embd", "n_embd_inp", "n_embd_out", "n_embd_head_k", "n_embd_head_v", "n_embd_k_gqa",
    "n_embd_v_gqa", "n_layer", "n_layer_all", "n_head", "n_head_kv", "n_rot", "n_swa", "is_swa_any", "n_gqa", "n_ff",
    "n_ff_shexp", "n_expert", "n_expert_used", "n_expert_groups", "n_group_used", "causal attn", "f_norm_eps",
    "f_norm_rms_eps", "f_clamp_kqv", "f_max_alibi_bias", "f_logit_scale", "f_attn_scale", "f_attention_scale",
    "f_attn_value_scale", "f_embedding_scale", "f_residual_scale", "freq_base_train", "freq_scale_train",
    "n_ctx_orig_yarn", "rope_yarn_log_mul", "rope_finetuned", "ssm_d_conv", "ssm_d_inner", "ssm_d_state",
    "ssm_dt_rank", "ssm_n_group", "ssm_dt_b_c_rms", "n_vocab", "n_merges", "max token length", "vocab_only",
    "no_alloc", "verbosity")
_NUMBER = r"(?:-?\d+(?:\.\d+)?(?:e[-+]\d+)?|\[[-\d, ]+\]|true|false|auto)"
_SAFE_LINE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    # "llama_context: n_ctx = 8192", "print_info: n_head_kv = [0, 0, 2, 0]": the applied model/context numbers
    rf"llama_context: (?:{'|'.join(_CONTEXT_KEYS)}) += +{_NUMBER}",
    rf"print_info: (?:{'|'.join(_INFO_KEYS)}) += +{_NUMBER}",
    # the build id, for the record
    r"common_params_print_info: build \d+ \([0-9a-f]+\) with (?:GNU|Clang|AppleClang|MSVC) \d+(?:\.\d+)* for "
    r"(?:Linux|Darwin|Windows) (?:x86_64|aarch64|arm64|AMD64|ARM64)",
))
# events whose fields hold free text (a path): parsed from the raw log, never kept
_UNKEPT_KINDS = frozenset({"multimodal_loaded"})


def _is_safe_message(message: str) -> bool:
    event = _match_message(message)
    if event is not None:
        return event[0] not in _UNKEPT_KINDS
    return any(p.fullmatch(message) for p in _SAFE_LINE_PATTERNS)


def scrub_line(line: str) -> str | None:
    """The line as it may be kept, or None. Allowlist: a line is kept unchanged only if its message is a known
    numbers-only event or a known-safe startup line; everything else (prompt dumps, token lists, generated text,
    request bodies, continuation lines of multi-line messages, unknown lines) is dropped."""
    line = _ANSI_COLOR.sub("", line.rstrip("\r\n"))
    jsonl = _split_jsonl(line)
    if jsonl is not None:
        level, texts = jsonl
        if not texts or not all(_is_safe_message(_LINE.fullmatch(t).group("msg").strip()) for t in texts):  # type: ignore[union-attr]
            return None
        # re-serialise so that only the known keys survive
        obj = json.loads(line)
        return json.dumps({"type": "log", "time": obj.get("time"), "level": level, "msg": obj["msg"]})
    m = _LINE.fullmatch(line)
    assert m is not None
    return line if m.group("msg") and _is_safe_message(m.group("msg").strip()) else None


def filter_stream(source: TextIO, sink: TextIO) -> tuple[int, int]:
    """Copy only the lines ``scrub_line`` keeps from `source` to `sink`, each written whole and flushed as it comes
    (a filter killed at any moment leaves no half line); returns (kept, dropped)."""
    kept = dropped = 0
    for line in source:
        safe = scrub_line(line)
        if safe is None:
            dropped += 1
            continue
        sink.write(safe + "\n")
        sink.flush()
        kept += 1
    return kept, dropped
