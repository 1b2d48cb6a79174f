"""reusebench.llama.logs against real llama-server logs (tests/data/logs, captured at -lv 4 from build 7e4c0a9 on the tiny
models, and b9873_hybrid from published build b9873, whose RAM cache and slot selection lines spell "sim" and
"sim_best" where b11434 spells "f_sim" and "f_sim_best", and spec_checkpoints from b11434 with n-gram speculation and
LLAMA_TRACE set) and against the formats the reference documents but the captures did not show."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from reusebench import tiny
from reusebench.llama import causes, logs, startup, task_log
from reusebench.llama.log_tail import LogTail
from reusebench.records import Served, served_by_log

from conftest import SLOW_MACHINE_S, raw_server

DATA = Path(__file__).parent / "data" / "logs"
FIXTURES = sorted(p.stem for p in DATA.glob("*.log"))


def parse_line(line: str) -> logs.Event | None:
    """The event on one plain-text line, or None."""
    events = logs.parse_lines([line])
    return events[0] if events else None


def _fixture_lines(name: str) -> list[str]:
    return (DATA / f"{name}.log").read_text().splitlines()


def _steps(name: str) -> dict[str, dict]:
    return json.loads((DATA / f"{name}.steps.json").read_text())


def _step_cause(name: str, step: str) -> causes.Cause:
    start, end = _steps(name)[step]["lines"]
    return causes.explain(logs.parse_lines(_fixture_lines(name)[start:end]))


# ---------------------------------------------------------------------------------------------------------------
# explain() on every captured request
# ---------------------------------------------------------------------------------------------------------------

EXPECTED_SUMMARIES = {
    ("hybrid", "first"): "no reuse (empty slot)",
    ("hybrid", "resend"): "restored checkpoint at n_tokens=692",
    ("hybrid", "reask"): "restored checkpoint at n_tokens=628",
    ("hybrid", "edit"): "forced full re-processing (no checkpoint before divergence)",
    ("hybrid", "return"): "found in RAM cache (f_keep=0.989, f_sim=0.993), restored checkpoint at n_tokens=628",
    ("hybrid", "hi"): "forced full re-processing (no checkpoint before divergence)",
    ("hybrid", "after_hi"): "found in RAM cache (f_keep=0.996, f_sim=1.000), restored checkpoint at n_tokens=692",
    ("hybrid", "lora_on"): "LoRA-change clear",
    ("hybrid", "lora_off"): "found in RAM cache (f_keep=0.996, f_sim=1.000), restored checkpoint at n_tokens=692",
    ("hybrid", "lora_on_again"): "LoRA-change clear after restoring from RAM",
    ("cache_reuse", "cut"): "cache-reuse shifted chunk then restored checkpoint at n_tokens=628",
    ("sleep", "after_sleep"): "woke from sleep (model reloaded, slots and RAM cache empty)",
    ("cache_ram_0", "after_hi"): "forced full re-processing (no checkpoint before divergence)",
    ("llama", "resend"): "kept 695 tokens in slot",
    ("llama", "cut"): "cache-reuse shifted 1 chunk(s)",
    ("np_auto", "b"): "no reuse",
    ("mmproj", "n_cache_reuse"): "restored checkpoint at n_tokens=628",
    # b9873: the checkpoint 4 tokens before the end was not made (within --checkpoint-min-step of the one 4 + 512
    # before it, llama.cpp #25472), so a resend returns to 2,069 - 516 = 1,553
    ("b9873_hybrid", "resend"): "restored checkpoint at n_tokens=1553",
    ("b9873_hybrid", "back_to_first"): "found in RAM cache (f_keep=0.997, f_sim=1.000), restored checkpoint at n_tokens=1553",
    ("b9873_hybrid", "next_turn"): "found in RAM cache (f_keep=1.000, f_sim=0.990)",
    ("images", "resend"): "restored checkpoint at n_tokens=2881",
}

ALL_STEPS = [(name, step) for name in FIXTURES for step in _steps(name)]


@pytest.mark.parametrize(("name", "step"), ALL_STEPS)
def test_logged_numbers_agree_with_http_timings(name: str, step: str) -> None:
    """The first "cached n_tokens" line is timings.cache_n and "prompt eval time" counts timings.prompt_n."""
    truth = _steps(name)[step]
    cause = _step_cause(name, step)
    assert (cause.cached_n_tokens, cause.prompt_n) == (truth["cache_n"], truth["prompt_n"])
    assert cause.task is not None and cause.selection in ("id", "lcp", "lru")


@pytest.mark.parametrize(("name", "step"), sorted(EXPECTED_SUMMARIES))
def test_summary(name: str, step: str) -> None:
    assert _step_cause(name, step).summary == EXPECTED_SUMMARIES[name, step]


def test_report_b_is_a_lora_clear_after_a_ram_restore() -> None:
    bug = _step_cause("hybrid", "lora_on_again")
    assert bug.ram_restored and bug.lora_clear and bug.lora_clear_after_ram_restore
    assert (bug.ram_f_keep, bug.ram_f_sim, bug.cached_n_tokens) == (0.996, 0.997, 0)
    plain = _step_cause("hybrid", "lora_on")  # the slot's own content cleared: expected, not the bug
    assert plain.lora_clear and not plain.ram_restored and not plain.lora_clear_after_ram_restore


def test_cause_fields_of_selected_scenarios() -> None:
    shifted = _step_cause("cache_reuse", "cut")
    assert (shifted.cache_reuse_chunks, shifted.checkpoint_n_tokens, shifted.ram_saved_n_tokens) == ((495,), 628, (699,))
    assert (shifted.selection, shifted.f_sim, shifted.f_keep) == ("lcp", 0.245, 0.230)
    assert _step_cause("mmproj", "n_cache_reuse").cache_reuse_ignored
    assert _step_cause("ram_limit", "d4").ram_evicted_mib == (0.349,)
    assert _step_cause("ram_limit", "hi_after_big").ram_skipped_too_large
    assert _step_cause("purge", "c").slots_purged == (0,)
    first = _step_cause("hybrid", "first")
    assert first.slot_was_empty and first.checkpoints_created == (628, 692) and first.n_tokens_after == 699


def test_an_image_4_tokens_before_the_end_is_encoded_again_on_every_resend() -> None:
    # b11434, tiny qwen35 with its mmproj: BOS, an image, 1,200 words, another image, 4 tokens (3,397 in all). No
    # checkpoint follows an image, so the one 4 tokens before the end is never made: a resend returns to the one
    # 4 + 512 before it (3,397 - 516 = 2,881), before the second image, and encodes that image again.
    cold, resend = _step_cause("images", "cold"), _step_cause("images", "resend")
    assert (cold.images_encoded, cold.checkpoints_created) == (2, (2881,))
    assert (resend.images_encoded, resend.checkpoint_n_tokens, resend.prompt_n) == (1, 2881, 516)
    assert resend.image_encode_ms is not None and resend.image_encode_ms > 0
    assert resend.image_decode_ms is not None and resend.image_decode_ms >= 0


def test_a_draft_undone_from_a_speculative_checkpoint_is_replayed_and_counted_once() -> None:
    # b11434, tiny qwen35, --spec-type ngram-mod, LLAMA_TRACE=1: a 200-token passage and its 48-token answer, then the
    # passage, the answer with its 21st token changed and the passage again. The drafter drafts the changed answer:
    # 19 of 46 accepted, the state restored from a speculative checkpoint and the 19 + 1 sampled replayed ("20/20");
    # 11 of 25, replayed ("12/12"); a 12-token draft accepted whole. The server's timings: 83 = 46 + 25 + 12 drafted,
    # 42 = 19 + 11 + 12 accepted.
    cause = _step_cause("spec_checkpoints", "passage_answer_passage")
    assert (cause.drafts, cause.drafts_rolled_back, cause.spec_checkpoints_restored) == (3, 2, 2)
    first = _step_cause("spec_checkpoints", "passage")  # a 1-token draft, accepted
    assert (first.drafts, first.drafts_rolled_back, first.spec_checkpoints_restored) == (1, 0, 0)


def test_the_log_classes_a_lora_clear_and_a_wake_apart_from_where_state_came_from() -> None:
    # one vocabulary with the reuse model (records.Served): a wake empties everything, a LoRA clear throws away what
    # the slot or the RAM cache had just given back
    def served(name: str, step: str) -> Served:
        return served_by_log(_step_cause(name, step).to_dict(), ram_cache=True)

    assert served("hybrid", "lora_on") is served("hybrid", "lora_on_again") is Served.LORA_CLEAR
    assert served("sleep", "after_sleep") is Served.WOKE
    assert served("hybrid", "resend") is Served.CHECKPOINT


def test_cause_to_dict_is_json() -> None:
    cause = _step_cause("cache_reuse", "cut")
    as_dict = json.loads(json.dumps(cause.to_dict()))
    assert as_dict["cache_reuse_chunks"] == [495] and as_dict["summary"] == cause.summary
    assert set(as_dict) == {f for f in causes.Cause.__dataclass_fields__}


def _event(kind: str, **fields: int | float | str) -> logs.Event:
    return logs.Event(kind, "info", 0, 1, fields, "")


PRECEDENCE_CASES = [
    # waking wins: nothing before it survives, so a LoRA clear after it discards nothing
    ([_event("sleep_exiting"), _event("lora_cache_cleared", loras_before=1, loras_after=1)], "woke from sleep"),
    # order matters: a clear *before* the RAM restore is not report B
    ([_event("lora_cache_cleared"), _event("ram_prompt_found", f_keep=1.0, f_sim=0.5)], "LoRA-change clear"),
    ([_event("ram_prompt_found", f_keep=1.0, f_sim=0.5), _event("forced_full_reprocess")],
     "found in RAM cache (f_keep=1.000, f_sim=0.500), then forced full re-processing"),
    ([_event("ram_prompt_found", f_keep=1.0, f_sim=0.997)], "found in RAM cache (f_keep=1.000, f_sim=0.997)"),
    ([], "no request in log"),
]


@pytest.mark.parametrize(("events", "summary_start"), PRECEDENCE_CASES)
def test_summary_precedence(events: list[logs.Event], summary_start: str) -> None:
    assert causes.explain(events).summary.startswith(summary_start)


# ---------------------------------------------------------------------------------------------------------------
# the event table
# ---------------------------------------------------------------------------------------------------------------

# Kinds whose message format is read from the b11434 source (docs/llama-server-reuse.md, "Log messages the parser
# keys on") but that the -lv 4 captures did not produce; one example message each, built from that format.
REFERENCE_ONLY_EXAMPLES = {
    "checkpoint_erased_old": "erasing old context checkpoint (pos_min = 10, pos_max = 10, n_tokens = 11, size = 0.057 MiB)",
    "ram_entry_evicted_over_limit": " - cache size limit reached, removing oldest entry (size = 747.843 MiB)",
    "ram_entry_evicted_over_token_limit":
        " - cache token limit (262144, est: 412000) reached, removing oldest entry (size = 12.500 MiB)",
    "ctx_shift_unsupported": "ctx_shift is not supported by multimodal, it will be disabled",
}


def _seen_kinds() -> set[str]:
    return {e.kind for name in FIXTURES for e in logs.parse_lines(_fixture_lines(name))}


def test_every_event_kind_is_seen_in_a_capture_or_has_a_reference_example() -> None:
    kinds = [kind for kind, _ in logs.EVENT_PATTERNS]
    assert len(kinds) == len(set(kinds)), "one pattern per kind"
    seen = _seen_kinds()
    unexplained = set(kinds) - seen - set(REFERENCE_ONLY_EXAMPLES)
    assert not unexplained, f"kinds with neither a capture nor an example: {sorted(unexplained)}"
    for kind, message in REFERENCE_ONLY_EXAMPLES.items():
        event = parse_line(message)
        assert event is not None and event.kind == kind, message
        assert kind not in seen, f"{kind} now appears in a capture: drop its synthetic example"


def test_a_message_tries_only_the_patterns_of_its_first_word_and_finds_what_trying_all_in_order_finds() -> None:
    # a busy -lv 4 log is mostly the RAM cache's listing (150,000 of 275,000 lines in tools/tap_load.py's), and
    # each line once tried every pattern before its own: every captured message, and every reference example,
    # gets the event the whole table in order gives
    def in_order(message: str) -> tuple[str, dict] | None:
        for kind, regex in logs._COMPILED:
            if m := regex.fullmatch(message):
                return kind, {k: logs._typed(v) for k, v in m.groupdict().items() if v is not None}
        return None
    messages = [logs._LINE.fullmatch(line).group("msg").strip()  # type: ignore[union-attr]
                for name in FIXTURES for line in _fixture_lines(name)] + list(REFERENCE_ONLY_EXAMPLES.values())
    found = [in_order(m.strip()) for m in messages]
    assert {f[0] for f in found if f} == {kind for kind, _ in logs.EVENT_PATTERNS}  # every pattern is tried
    assert [logs._match_message(m.strip()) for m in messages] == found
    # and the kinds a reader skips (the task log: the RAM cache's listing) are left out, nothing else
    listing = task_log.LISTING_KINDS
    for name in FIXTURES:
        lines = _fixture_lines(name)
        assert logs.parse_lines(lines, skip=listing) == [e for e in logs.parse_lines(lines) if e.kind not in listing]


def test_plain_prefix_variants() -> None:
    full = parse_line("0.03.917.786 I slot launch_slot_: id  0 | task -1 | clearing cache for lora change. 1 loras -> 1 loras")
    bare = parse_line("slot launch_slot_: id  0 | task -1 | clearing cache for lora change. 1 loras -> 1 loras")
    assert full is not None and bare is not None
    assert (full.kind, full.level, full.slot, full.task, dict(full.fields)) == (
        "lora_cache_cleared", "info", 0, -1, {"loras_before": 1, "loras_after": 1})
    assert (bare.level, bare.slot, dict(bare.fields)) == (None, 0, dict(full.fields))
    warn = parse_line("0.00.070.935 W srv    load_model: cache_reuse is not supported by multimodal, it will be disabled")
    assert warn is not None and (warn.level, warn.slot, warn.fields["reason"]) == ("warn", None, "multimodal")
    colored = parse_line("\x1b[0m0.00.057.419 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'true'")
    assert colored is not None and colored.fields == {"n_slots": 4, "n_ctx_slot": 8192, "kv_unified": "true"}


def test_a_number_line_with_anything_appended_is_not_an_event() -> None:
    assert parse_line("srv  load_model: prompt cache is enabled, size limit: 8192 MiB and the river") is None
    assert parse_line("slot operator(): id 0 | task 1 | n_past was set to 5 'text'") is None


def test_jsonl_objects() -> None:
    """b11434 --log-jsonl: one object per log call; a multi-line message holds several lines."""
    lines = [
        json.dumps({"type": "log", "time": 1, "level": "info",
                    "msg": "slot get_availabl: id  2 | task -1 | selected slot by LRU, t_last = -1\n"}),
        json.dumps({"type": "log", "time": 2, "level": "warn",
                    "msg": "srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 747.843 MiB)\n"}),
        json.dumps({"type": "log", "time": 3, "level": "info",
                    "msg": "slot print_timing: id  2 | task 7 | \nprompt eval time =      94.35 ms /   696 tokens "
                           "(    0.14 ms per token,  7376.48 tokens per second)\n"}),
        '{"type": "other"}',
        "not json {",
    ]
    events = logs.parse_lines(lines)
    assert [(e.kind, e.level, e.slot, e.task) for e in events] == [
        ("slot_selected_by_lru", "info", 2, -1),
        ("ram_entry_evicted_for_room", "warn", None, None),
        ("prompt_eval", "info", 2, 7),  # the timing line inherits the slot and task of its first line
    ]
    assert events[2].fields["n_tokens"] == 696 and events[1].fields["size_mib"] == 747.843


# ---------------------------------------------------------------------------------------------------------------
# startup facts
# ---------------------------------------------------------------------------------------------------------------


def _facts(name: str) -> dict:
    return startup.startup_facts(logs.parse_lines(_fixture_lines(name)))


def test_startup_facts_defaults() -> None:
    facts = _facts("hybrid")
    assert {k: facts[k] for k in ("n_slots", "n_ctx_slot", "kv_unified", "prompt_cache_enabled",
                                   "prompt_cache_limit_mib", "checkpoints_max", "checkpoints_min_spacing",
                                   "multimodal_loaded", "disabled_options", "idle_slots_saved")} == {
        "n_slots": 1, "n_ctx_slot": 8192, "kv_unified": False, "prompt_cache_enabled": True,
        "prompt_cache_limit_mib": 8192, "checkpoints_max": 32, "checkpoints_min_spacing": 8192,
        "multimodal_loaded": False, "disabled_options": [], "idle_slots_saved": True}


@pytest.mark.parametrize(("name", "kind", "reason"), [
    ("mmproj", "cache_reuse_unsupported", "multimodal"),
    ("qwen35_reuse", "cache_reuse_unsupported", "this context"),
    ("cache_ram_0", "cache_idle_slots_need_cache_ram", None),
    ("llama", "swa_full_unsupported", None),
])
def test_disabled_option_warnings(name: str, kind: str, reason: str | None) -> None:
    [warning] = _facts(name)["disabled_options"]
    assert (warning["kind"], warning["reason"], warning["level"]) == (kind, reason, "warn")
    assert warning["line"] in (DATA / f"{name}.log").read_text()


def test_startup_facts_of_special_profiles() -> None:
    assert _facts("mmproj")["multimodal_loaded"]
    assert (_facts("cache_ram_0")["prompt_cache_enabled"], _facts("cache_ram_0")["idle_slots_saved"]) == (False, False)
    assert _facts("llama")["checkpoints_max"] == 0
    auto = _facts("np_auto")
    assert (auto["n_slots"], auto["kv_unified"], auto["n_parallel_auto"], auto["idle_slots_cleared"]) == (4, True, True, True)
    assert _facts("ram_limit")["prompt_cache_limit_mib"] == 1
    # a wake repeats the startup lines; the warnings are listed once
    assert [e.kind for e in logs.parse_lines(_fixture_lines("sleep"))].count("slots_initialized") == 2


# ---------------------------------------------------------------------------------------------------------------
# scrubbing
# ---------------------------------------------------------------------------------------------------------------

# Lines that carry text, as printed by this build at -lv 5 / -v (DBG), plus generic shapes from other builds.
TEXT_LINES = [
    '0.00.294.658 D slot launch_slot_: id  0 | task -1 | launching slot : {"id":0,"prompt":"<s> zebra marker river"}',
    "0.00.281.798 D slot process_toke: id  0 | task 0 | n_gen = 1, n_remaining = 3, next token:   426 ' her'",
    '0.00.315.015 D srv    operator(): http: streamed chunk: data: {"index":0,"content":" chee","tokens":[426]}',
    'Parsed message: {"role":"assistant","content":" build car har mus"}',
    "0.00.217.121 I slot   operator(): id  0 | task 1 | prompt: 'zebra marker river golden'",
    "0.00.217.121 I slot   operator(): id  0 | task 1 | cache_tokens: [1, 426, 572]",
    '{"prompt": "zebra marker river", "n_predict": 4}',
    "zebra marker river golden harvest",  # continuation line of a multi-line message
    "0.00.063.838 I srv          init: init: chat template, example_format: '<|im_start|>system",
    "0.00.033.927 I print_info: general.name          = reusebench tiny granitehybrid",
    "0.00.034.056 I print_info: BOS token             = 1 '<s>'",
]


@pytest.mark.parametrize("line", TEXT_LINES)
def test_text_lines_are_dropped(line: str) -> None:
    assert logs.scrub_line(line) is None


def test_scrubbed_captures_keep_every_event_and_only_safe_lines() -> None:
    for name in FIXTURES:
        raw = _fixture_lines(name)
        kept = [s for s in map(logs.scrub_line, raw) if s is not None]
        # every event but the mmproj's path (free text: parsed from the raw log, never kept)
        assert [e.kind for e in logs.parse_lines(kept)] == [
            e.kind for e in logs.parse_lines(raw) if e.kind != "multimodal_loaded"], name
        for line in kept:
            assert "'" not in line.replace("kv_unified = 'true'", "").replace("kv_unified = 'false'", ""), line
            assert not line.startswith(("\t", "<|im_")), line
    kept = {logs.scrub_line(line) for line in _fixture_lines("hybrid")}
    assert "0.00.041.595 I llama_context: n_ctx                 = 8192" in kept
    assert "0.00.008.252 I cmn  common_param: common_params_print_info: build 1 (7e4c0a9) with GNU 11.4.0 for Linux x86_64" in kept


def test_scrub_jsonl() -> None:
    safe = {"type": "log", "time": 5, "level": "info", "extra": "x",
            "msg": "slot launch_slot_: id  0 | task 3 | processing task, is_child = 0\n"}
    assert json.loads(logs.scrub_line(json.dumps(safe)) or "null") == {k: v for k, v in safe.items() if k != "extra"}
    unsafe = dict(safe, msg="slot launch_slot_: id  0 | task 3 | processing task, is_child = 0\nzebra marker river\n")
    assert logs.scrub_line(json.dumps(unsafe)) is None


# ---------------------------------------------------------------------------------------------------------------
# LogTail
# ---------------------------------------------------------------------------------------------------------------


def test_log_tail_reads_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    assert (tail.offset(), tail.read_since(0)) == (0, [])
    log.write_bytes(b"one\ntw")
    start = tail.offset()
    assert start == 4 and tail.read_since(0) == ["one"]
    with log.open("ab") as f:
        f.write(b"o\nthree\nfo")
    assert tail.read_since(start) == ["two", "three"]  # the line being written at offset() time is read whole
    assert tail.offset() == len(b"one\ntwo\nthree\n")


def test_log_tail_offset_scans_back_across_blocks(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"a\n" + b"x" * (3 * 64 * 1024))
    assert LogTail(log).offset() == 2


# ---------------------------------------------------------------------------------------------------------------
# end to end: a real server, a marker sentence, and the kept log
# ---------------------------------------------------------------------------------------------------------------

def released(tail: LogTail, start: int) -> list[str]:
    """The log since `start` once it has the request's "stop processing" line: the server writes its log from a
    thread of its own, so that line can land after the response has arrived."""
    deadline = time.monotonic() + SLOW_MACHINE_S
    while True:
        window = tail.read_since(start)
        if any(event.kind == "stop_processing" for event in logs.parse_lines(window)):
            return window
        assert time.monotonic() < deadline, "the request's 'stop processing' line never reached the log"
        time.sleep(0.01)


MARKER_WORDS = ("harvest", "golden", "cherry", "sailor", "lemon", "village", "orange", "painter")


@pytest.mark.e2e
@pytest.mark.parametrize("verbosity", ["4", "5"])
def test_kept_log_has_the_numbers_but_no_prompt_or_output_text(verbosity: str) -> None:
    """At -lv 4 this build prints no text; -lv 5 (DBG) prints the prompt and the generated pieces, which proves that
    the scrubber really removes text from a real log and not only from synthetic lines."""
    marker = " ".join(MARKER_WORDS)
    document = " ".join(random.Random(3).choice(tiny.WORDS) for _ in range(300))
    with raw_server(tiny.model_path("granitehybrid"), log_verbosity=int(verbosity)) as (client, raw_log):
        tail = LogTail(raw_log)
        for _ in range(2):  # first load, then an identical resend served by a checkpoint
            start = tail.offset()
            reply = client.post("/completion", json={"prompt": f"{document} {marker}", "n_predict": 4, "temperature": 0})
            assert reply.status_code == 200, reply.text
            window = released(tail, start)
        cause = causes.explain(logs.parse_lines(window))
        generated = reply.json()["content"]
        raw = raw_log.read_text(errors="replace")
    assert cause.checkpoint_n_tokens is not None and cause.cached_n_tokens == reply.json()["timings"]["cache_n"]
    kept = "\n".join(s for s in map(logs.scrub_line, raw.splitlines()) if s is not None)
    assert "restored context checkpoint" in kept and "created context checkpoint" in kept
    assert "prompt eval time" in kept and "selected slot by LCP similarity" in kept
    assert set(re.findall(r"[a-z]+", kept)).isdisjoint(MARKER_WORDS)
    assert len(generated.split()) < 2 or generated.strip() not in kept
    if verbosity == "5":
        assert marker in raw  # the DBG "launching slot" JSON carries the prompt
