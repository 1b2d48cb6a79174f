"""The reuse model (reusebench.reuse.expectation) on its own: report A's figures, the control, and each rule of
docs/llama-server-reuse.md as a small history of requests. No server: these are the model's own rules; the
real server checks them in tests/test_scenarios.py and tools/agreement.py."""

from __future__ import annotations

from reusebench.capability import Capabilities
from reusebench.records import Served
from reusebench.reuse.expectation import ServerModel
from reusebench.reuse.image_runs import run_ids
from reusebench.reuse.segments import user_starts
from reusebench.reuse.server_inputs import Launch, Memory, active_cache_reuse, launch_of_options
from reusebench.reuse.server_state import Held

HYBRID = Memory("hybrid", can_shift=False)
ATTENTION = Memory("attention", can_shift=True)
TINY_BASE = {"parallel": 1, "ubatch-size": 512, "batch-size": 2048, "ctx-checkpoints": 32, "cache-ram": 8192}
BOS = [1]
DOC = list(range(1000, 3048))  # 2,048 document tokens
OTHER = list(range(4000, 6048))
Q1, Q2 = list(range(100, 117)), list(range(200, 216))  # the second question is one token shorter (report A)
ANSWER = list(range(300, 308))  # n_predict 8
PROMPT = BOS + DOC + Q1


DEFAULT_RULES = Capabilities()


def model(memory: Memory = HYBRID, rules: Capabilities = DEFAULT_RULES, **options: object) -> ServerModel:
    return ServerModel(memory, launch_of_options({**TINY_BASE, **options}), rules)


def send(m: ServerModel, tokens: list[int], **kwargs: object) -> tuple[int, str]:
    expected = m.complete(tokens, **kwargs)  # type: ignore[arg-type]
    m.answered(ANSWER)
    return expected.prompt_n, expected.cause


def checkpoints(m: ServerModel) -> list[int]:
    return [c.n_tokens for c in m.slots[m.last_slot].held.checkpoints]


def test_report_a_on_a_hybrid() -> None:
    m = model()
    assert send(m, PROMPT) == (2066, "empty slot")
    assert checkpoints(m) == [2066 - 516, 2066 - 4]  # 4 + n_ubatch and 4 tokens before the end
    assert send(m, PROMPT) == (4, "restored checkpoint at n_tokens=2062")
    assert send(m, BOS + OTHER + Q1)[1] == "forced full re-processing (no checkpoint before divergence)"
    assert send(m, PROMPT) == (4, "found in RAM cache; restored checkpoint at n_tokens=2062")
    assert send(m, BOS + DOC + Q2) == (515, "restored checkpoint at n_tokens=1550")
    edited = BOS + DOC[:1024] + [7] + DOC[1024:] + Q1
    assert send(m, edited) == (len(edited), "forced full re-processing (no checkpoint before divergence)")


def test_the_pure_attention_control_keeps_any_common_prefix() -> None:
    m = model(ATTENTION)
    send(m, PROMPT)
    assert checkpoints(m) == []
    assert send(m, PROMPT) == (1, "kept 2066 tokens in slot")  # one token is given back for its logits
    assert send(m, BOS + DOC + Q2)[0] == len(Q2)
    edited = BOS + DOC[:1024] + [7] + DOC[1024:] + Q1
    assert send(m, edited)[0] == len(edited) - 1025


def saved_and_restored_after_restart(m: ServerModel) -> Held:
    """PROMPT sent and saved to a slot file, a restart, the file restored: what the file holds."""
    send(m, PROMPT)
    saved = m.saved(0)
    m.restart()
    m.restore(0, saved)
    return saved


def test_a_restored_slot_file_has_no_checkpoints_so_only_a_strict_extension_reuses_it() -> None:
    m = model()
    saved = saved_and_restored_after_restart(m)
    assert send(m, PROMPT)[0] == len(PROMPT)
    m.restore(0, saved)
    assert send(m, BOS + DOC + Q2)[0] == len(BOS + DOC + Q2)
    m.restore(0, saved)
    extension = PROMPT + ANSWER + Q2
    assert send(m, extension) == (len(Q2) + 1, f"kept {len(PROMPT) + 7} tokens in slot")  # the last answer token


def test_with_a_draft_model_a_request_that_keeps_a_restored_slot_is_not_predicted() -> None:
    # b11434 restores a slot file into the target's context alone (llama.cpp #28619): the draft's holds other
    # positions, and the request that keeps the restored state fails. One that re-processes everything rebuilds both.
    m = model(**{"spec-type": "draft-simple", "spec-draft-model": "draft.gguf"})
    saved = saved_and_restored_after_restart(m)
    assert m.complete(PROMPT).not_modelled == ""  # no checkpoint: everything again
    m.answered(ANSWER)
    m.restore(0, saved)
    extension = m.complete(PROMPT + ANSWER + Q2)
    assert "#28619" in extension.not_modelled
    loaded = model(**{"spec-type": "none", "spec-draft-model": "draft.gguf"})  # loaded, never drafting
    saved = saved_and_restored_after_restart(loaded)
    assert loaded.complete(PROMPT + ANSWER + Q2).not_modelled == ""
    plain = model(**{"spec-type": "ngram-mod"})  # no draft context: predicted as ever
    saved = saved_and_restored_after_restart(plain)
    assert plain.complete(PROMPT + ANSWER + Q2).not_modelled == ""


def test_b9246_to_b9442_send_an_extension_of_all_the_slot_holds_back_to_a_checkpoint() -> None:
    # The next turn of a chat extends everything the slot holds (the prompt, the answer but its last token). b11434
    # keeps it all: 1 + the question. The builds whose test took `n_past <= n_tokens` one lower go back to the
    # checkpoint 4 before the prompt's end: 4 + the 7 answer tokens + 1 + the question. After a restore, with no
    # checkpoint, everything.
    turn = PROMPT + ANSWER + Q2
    for rules, expected in ((Capabilities(), len(Q2) + 1), (Capabilities(extension_returns_to_checkpoint=True),
                                                            4 + 7 + 1 + len(Q2))):
        m = model(rules=rules)
        send(m, PROMPT)
        assert send(m, turn)[0] == expected, rules
    m = model(rules=Capabilities(extension_returns_to_checkpoint=True))
    saved = saved_and_restored_after_restart(m)
    m.restore(0, saved)
    assert send(m, turn) == (len(turn), "forced full re-processing (no checkpoint before divergence)")


def test_b9246_to_b9496_re_read_a_prompt_that_shares_only_its_first_token_with_an_attention_slot() -> None:
    # A chat after another document keeps only BOS. Its test, one lower there, has threshold 1 - 0 - 1 = 0, which
    # the attention cache's lowest position (0) does not lie below, and there is no checkpoint to go back to: all
    # 1 + 2,048 + 17 tokens again (measured on b9442's control, growth turn 1: 8,231 of 8,231). Later builds keep BOS.
    chat = BOS + OTHER + Q1
    for rules, expected in ((Capabilities(), (len(chat) - 1, "kept 1 tokens in slot")),
                            (Capabilities(extension_returns_to_checkpoint=True),
                             (len(chat), "forced full re-processing (no checkpoint before divergence)"))):
        m = model(ATTENTION, rules=rules)
        send(m, PROMPT)
        assert send(m, chat) == expected, rules
        assert send(m, chat + ANSWER + Q2)[0] == 1 + len(Q2)  # a longer shared prefix passes either test


def test_a_build_whose_slot_files_carry_checkpoints_restores_them() -> None:
    # b11549: the file holds 1550 and 2062, so a restart loses nothing a checkpoint can give back
    m = model(rules=Capabilities(slot_file_checkpoints=True))
    saved = saved_and_restored_after_restart(m)
    assert send(m, PROMPT) == (4, "restored checkpoint at n_tokens=2062")
    m.restore(0, saved)
    assert send(m, BOS + DOC + Q2) == (515, "restored checkpoint at n_tokens=1550")


def test_a_restore_that_keeps_the_slot_s_checkpoints_returns_to_them_and_to_another_document_s() -> None:
    # 2026-03: the restore clears only the tokens. After a restart the resend re-processes all and makes
    # checkpoints on the same tokens, which the next restore keeps: the re-ask returns to 1550 (report A's 515).
    m = model(rules=Capabilities(restore_keeps_slot_checkpoints=True))
    saved = saved_and_restored_after_restart(m)
    assert send(m, PROMPT)[0] == len(PROMPT)
    m.restore(0, saved)
    reask = m.complete(BOS + DOC + Q2)
    assert (reask.prompt_n, reask.wrong_output) == (515, False)
    # Over a slot that holds another document, the kept checkpoints are that document's: reuse with its state.
    m.answered(ANSWER)
    send(m, BOS + OTHER[:1000] + Q1)  # checkpoints at 502 and 1014, inside DOC's length
    m.restore(0, saved)
    foreign = m.complete(BOS + DOC + Q2)
    assert (foreign.prompt_n, foreign.wrong_output) == (len(BOS + DOC + Q2) - 1014, True)
    assert foreign.cause == "restored checkpoint at n_tokens=1014 (another prompt's, kept across the restore)"


def test_a_build_without_close_checkpoints_makes_none_in_a_short_prompt_and_none_within_64_tokens() -> None:
    # 2026-03: report A's two end checkpoints are 512 apart and stay; a 21-token probe gets none, so the next
    # turn of a conversation that the probe displaced cannot return to the probe's own checkpoint at 17
    far = model(rules=Capabilities(close_checkpoints=False))
    send(far, PROMPT)
    assert checkpoints(far) == [1550, 2062]
    probe = BOS + DOC[:20]
    for rules, expected in ((Capabilities(), [1, 17]), (Capabilities(close_checkpoints=False), [])):
        m = model(rules=rules, **{"ubatch-size": 16, "batch-size": 64})
        send(m, probe)
        assert checkpoints(m) == expected


def test_without_user_message_checkpoints_a_chat_edit_re_processes_everything() -> None:
    delimiter = [9]
    prompt = BOS + delimiter + DOC[:600] + delimiter + DOC[600:1200]
    starts = user_starts(prompt, delimiter)
    edited = prompt[:650] + [7] + prompt[650:]  # after the last user message (602), before 1203 - 516
    for rules, expected in ((Capabilities(), len(edited) - 602), (Capabilities(user_message_checkpoints=False),
                                                                 len(edited))):
        m = model(rules=rules)
        send(m, prompt, user_starts=starts)
        assert send(m, edited, user_starts=user_starts(edited, delimiter))[0] == expected


def test_a_ram_cache_that_keeps_each_entry_s_lora_restores_it_and_never_serves_it_to_another() -> None:
    # report B's fix: the third request reuses the whole conversation, and the no-LoRA request cannot hit
    m = ServerModel(HYBRID, launch_of_options({**TINY_BASE, "cache-ram": 256}, lora_adapters=1),
                    Capabilities(ram_cache_keeps_lora=True))
    lora, no_lora = [{"id": 0, "scale": 1.0}], [{"id": 0, "scale": 0.0}]
    send(m, PROMPT, lora=lora)
    send(m, BOS + Q2, lora=no_lora)
    more = PROMPT + ANSWER + Q2
    assert send(m, more, lora=lora) == (len(Q2) + 1, f"found in RAM cache; kept {len(PROMPT) + 7} tokens in slot")
    send(m, BOS + Q2, lora=no_lora)
    served = m.complete(more, lora=no_lora)
    assert (served.prompt_n, served.wrong_output) == (len(more), False)


def test_the_model_classes_a_lora_clear_and_a_wake_as_the_log_does() -> None:
    m = ServerModel(HYBRID, launch_of_options(TINY_BASE, lora_adapters=1), DEFAULT_RULES)
    lora, no_lora = [{"id": 0, "scale": 1.0}], [{"id": 0, "scale": 0.0}]
    send(m, PROMPT, lora=no_lora)
    assert m.complete(PROMPT + ANSWER + Q2, lora=lora).served is Served.LORA_CLEAR
    m.answered(ANSWER)
    m.sleep()
    assert m.complete(PROMPT, lora=lora).served is Served.WOKE
    m.answered(ANSWER)
    assert m.complete(PROMPT, lora=lora).served is Served.CHECKPOINT  # awake again: the resend's checkpoint


def test_one_checkpoint_keeps_only_the_last_so_a_reask_re_processes_everything() -> None:
    m = model(**{"ctx-checkpoints": 1})
    send(m, PROMPT)
    assert checkpoints(m) == [2062]
    assert send(m, PROMPT)[0] == 4
    assert send(m, BOS + DOC + Q2)[0] == len(BOS + DOC + Q2)


def test_no_checkpoints_no_reuse_on_a_hybrid() -> None:
    m = model(**{"ctx-checkpoints": 0})
    send(m, PROMPT)
    assert checkpoints(m) == []
    assert send(m, PROMPT)[0] == len(PROMPT)


def test_user_message_checkpoints_follow_checkpoint_min_step() -> None:
    delimiter = [5, 6]
    # the document as 8 user messages of 256 tokens, then the question as the last one
    prompt = BOS + [t for i in range(0, 2048, 256) for t in delimiter + DOC[i:i + 254]] + delimiter + Q1
    starts = user_starts(prompt, delimiter)
    assert starts[:3] == (1, 257, 513) and len(starts) == 9
    sparse = model(**{"checkpoint-min-step": 8192})
    send(sparse, prompt, user_starts=starts)
    dense = model(**{"checkpoint-min-step": 256})
    send(dense, prompt, user_starts=starts)
    assert len(checkpoints(dense)) > len(checkpoints(sparse))
    # the first user message, then each one more than 256 tokens past the last checkpoint (257 is not)
    assert {1, 513, 1025, 1537} <= set(checkpoints(dense)) and 257 not in checkpoints(dense)
    # a mid-document edit now goes back only to the user message before it
    edited = prompt[:1100] + [7] + prompt[1100:]
    assert send(dense, edited, user_starts=user_starts(edited, delimiter)) == (
        len(edited) - 1025, "restored checkpoint at n_tokens=1025")


def test_report_b_lora_change_clears_a_state_just_restored_from_ram_and_then_serves_it_wrongly() -> None:
    m = ServerModel(HYBRID, launch_of_options({**TINY_BASE, "cache-ram": 256}, lora_adapters=1), DEFAULT_RULES)
    lora, no_lora = [{"id": 0, "scale": 0.5}], [{"id": 0, "scale": 0.0}]
    send(m, PROMPT)
    assert send(m, PROMPT, lora=lora) == (len(PROMPT), "LoRA-change clear")
    send(m, BOS + Q2, lora=no_lora)  # takes the only slot; the conversation goes to RAM
    more = PROMPT + ANSWER + Q2
    assert send(m, more, lora=lora) == (len(more), "LoRA-change clear after restoring from RAM")
    send(m, BOS + Q2, lora=no_lora)
    served = m.complete(more, lora=no_lora)
    assert (served.prompt_n, served.wrong_output) == (4, True)  # RAM entries carry no LoRA


def test_cache_reuse_is_disabled_where_the_server_disables_it_and_unsafe_on_a_shiftable_hybrid() -> None:
    assert active_cache_reuse(HYBRID, Launch(cache_reuse=256)) == 0  # IMRoPE: "not supported by this context"
    assert active_cache_reuse(Memory("hybrid", True), Launch(cache_reuse=256, multimodal=True)) == 0
    m = model(Memory("hybrid", can_shift=True), **{"cache-reuse": 256})
    send(m, PROMPT)
    cut = BOS + DOC[:200] + DOC[400:] + Q1
    shifted = m.complete(cut)
    assert shifted.wrong_output and shifted.cause == "cache-reuse shifted chunk then restored checkpoint at n_tokens=1550"
    assert shifted.prompt_n == len(cut) - 1550


def test_sleep_drops_every_cache() -> None:
    m = model()
    send(m, PROMPT)
    m.sleep()
    assert send(m, PROMPT) == (len(PROMPT), "empty slot")


def test_slot_selection_by_similarity_keeps_each_conversation_in_its_slot() -> None:
    m = model(ATTENTION, parallel=2, **{"cache-ram": 0})
    send(m, PROMPT)
    assert m.last_slot == 1  # LRU, ties to the last slot
    send(m, BOS + OTHER + Q1)  # shares only BOS: LRU again, the never-used slot
    assert m.last_slot == 0
    assert send(m, PROMPT)[0] == 1 and m.last_slot == 1  # by similarity


def test_launch_options_read_as_the_server_reads_them() -> None:
    assert launch_of_options({}) == Launch()  # auto: 4 unified slots, 32 checkpoints, 8 GiB of RAM cache
    one = launch_of_options({"parallel": 1, "cache-ram": 0, "ubatch-size": 4096})
    assert (one.n_slots, one.kv_unified, one.cache_idle_slots, one.n_ubatch) == (1, False, False, 2048)




def test_a_launch_speculates_with_a_spec_type_or_a_draft_model() -> None:
    # its calls then go unstreamed (llama.cpp #27196), and no step stops at its count
    assert not launch_of_options(TINY_BASE).speculative
    assert not launch_of_options({**TINY_BASE, "spec-type": "none"}).speculative
    assert launch_of_options({**TINY_BASE, "spec-type": "ngram-mod"}).speculative
    assert launch_of_options({**TINY_BASE, "spec-draft-model": "draft.gguf"}).speculative


def test_no_checkpoint_follows_an_image_so_one_4_tokens_before_the_end_sends_a_resend_back_past_it() -> None:
    # tests/data/logs/images.log, b11434: BOS, image (16), 3,360 text tokens, image (16), 4 tokens = 3,397. The batch
    # after the second image is the last 4 tokens, so no checkpoint 4 before the end: only 3,397 - 516 = 2,881.
    first, second = run_ids(0, 16), run_ids(1, 16)
    text = list(range(1000, 4360))
    prompt = BOS + first + text + second + [7, 8, 9, 10]
    images = ((1, 16), (3377, 16))
    m = model()
    assert send(m, prompt, images=images) == (3397, "empty slot")
    assert checkpoints(m) == [2881]
    assert send(m, prompt, images=images) == (516, "restored checkpoint at n_tokens=2881")
    # another image in the second's place: the prompts share everything up to it, and the same checkpoint serves
    other = BOS + first + text + run_ids(2, 16) + [7, 8, 9, 10]
    assert send(m, other, images=images) == (516, "restored checkpoint at n_tokens=2881")
    # a build that checkpoints right after an image (probed: checkpoint_after_image) keeps all but the last 4
    after = model(rules=Capabilities(checkpoint_after_image=True))
    send(after, prompt, images=images)
    assert send(after, prompt, images=images) == (4, "restored checkpoint at n_tokens=3393")


def test_a_text_batch_stops_where_an_image_begins_and_the_image_is_one_chunk() -> None:
    # an image 100 tokens before the end: the checkpoints 4 + 512 and 4 before the end are both made (the batch
    # after the image runs to 4 before the end; the last 4 start a batch of their own, not after an image)
    prompt = BOS + list(range(1000, 3000)) + run_ids(0, 16) + list(range(3000, 3100))
    m = model()
    assert send(m, prompt, images=((2001, 16),))[0] == 2117
    assert checkpoints(m) == [2117 - 516, 2117 - 4]
