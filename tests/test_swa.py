"""Sliding-window memory in the reuse model: the window cache's size, its allocator cell by cell
(reusebench.reuse.swa), and what a Gemma 3-class server keeps because of it. No server: the rules are the
model's own; tests/test_scenarios.py and `reusebench agreement` hold them against the real one."""

from __future__ import annotations

from reusebench.capability import Capabilities
from reusebench.reuse import swa
from reusebench.reuse.expectation import ServerModel
from reusebench.reuse.server_inputs import Memory, can_shift, launch_of_options

WINDOWED = Memory("swa", can_shift=True, window=128, window_layers=5)  # tiny:gemma3
TINY_BASE = {"parallel": 1, "ubatch-size": 512, "batch-size": 2048, "ctx-checkpoints": 32, "cache-ram": 8192}
# 0.3.17's rules: an unbounded checkpoint search, whole states written, --swa-full keeps the window test
BEFORE_SWA_FIXES = Capabilities(checkpoint_search_bounded=False, swa_state_window_only=False,
                                swa_full_drops_window=False)
BOS = [1]
DOC = list(range(1000, 3048))  # 2,048 document tokens
OTHER = list(range(4000, 6048))
Q1, Q2 = list(range(100, 117)), list(range(200, 216))
ANSWER = list(range(300, 308))  # n_predict 8: 7 fed back
PROMPT = BOS + DOC + Q1  # 2,066 tokens
EDITED = BOS + DOC[:1024] + [7] + DOC[1024:] + Q1  # diverges at 1,025


DEFAULT_RULES = Capabilities()


def model(rules: Capabilities = DEFAULT_RULES, **options: object) -> ServerModel:
    return ServerModel(WINDOWED, launch_of_options({**TINY_BASE, **options}, n_ctx=4096), rules)


def send(m: ServerModel, tokens: list[int]) -> tuple[int, str]:
    expected = m.complete(tokens)
    m.answered(ANSWER)
    return expected.prompt_n, expected.cause




def test_the_window_cache_holds_the_window_of_each_sequence_plus_a_ubatch_padded_to_256() -> None:
    assert swa.window_cells(4096, 128, 512, 1, unified=True, swa_full=False) == 768  # 128 + 512 -> 768
    assert swa.window_cells(4096, 128, 512, 1, unified=True, swa_full=True) == 4096  # --swa-full: the context
    assert swa.window_cells(16384, 512, 512, 1, unified=True, swa_full=False) == 1024  # Gemma 3 270M: 512 + 512
    assert swa.window_cells(8192, 128, 512, 4, unified=True, swa_full=False) == 1024  # 4 x 128 + 512
    assert swa.window_cells(8192, 128, 512, 4, unified=False, swa_full=False) == 768  # one stream per slot
    assert swa.window_cells(1000, 512, 512, 1, unified=True, swa_full=False) == 1024  # never above the context


def test_a_window_cache_shifts_only_when_it_is_as_large_as_the_context() -> None:
    # --cache-reuse needs every position shifted: a window cache that dropped some cannot
    assert not can_shift(WINDOWED, launch_of_options(TINY_BASE, n_ctx=4096))
    assert can_shift(WINDOWED, launch_of_options({**TINY_BASE, "swa-full": True}, n_ctx=4096))


def test_a_cell_is_taken_over_only_once_its_position_left_the_window() -> None:
    cells = swa.Cells(8, window=4)
    cells.decode(0, range(8), n_ubatch=8)  # 0..7 fill the 8 cells
    cells.decode(0, [8], n_ubatch=1)  # the head wraps; position 0 is 8 behind 8, outside the window of 4
    assert (cells.pos, cells.pos_min(0)) == ([8, 1, 2, 3, 4, 5, 6, 7], 1)
    # a saved state keeps only positions within the window of its last (5..8), in cell order; or all of them
    assert cells.state(0, window_only=True) == (8, 5, 6, 7)
    assert cells.state(0, window_only=False) == (8, 1, 2, 3, 4, 5, 6, 7)


def test_a_chunked_window_keeps_only_the_current_chunk() -> None:
    cells = swa.Cells(8, window=4, chunked=True)  # llama4's rule: chunks 0..3, 4..7, 8..11
    cells.decode(0, range(8), n_ubatch=8)
    cells.decode(0, [8], n_ubatch=1)  # 8 starts a chunk: every cell of 0..7 left the window, the first is taken
    assert (cells.pos, cells.pos_min(0)) == ([8, 1, 2, 3, 4, 5, 6, 7], 1)
    # a saved state keeps only the last position's chunk (8), where a standard window of 4 would keep 5..8
    assert cells.state(0, window_only=True) == (8,)


def test_the_scan_starts_at_the_head_so_freed_cells_at_the_end_can_stay_empty() -> None:
    cells = swa.Cells(8, window=4)
    cells.decode(0, range(6), n_ubatch=8)
    cells.seq_rm(0, 4)  # a divergence at 4 frees cells 4 and 5; the head goes back to the first freed one
    assert cells.head == 4
    cells.decode(0, [4, 5, 6, 7, 8], n_ubatch=8)  # cells 4..7 are empty, then 0 (position 0 is 5 behind 5)
    assert (cells.pos, cells.pos_min(0)) == ([8, 1, 2, 3, 4, 5, 6, 7], 1)
    cells.seq_rm(0, 6)  # frees cells 6, 7 and 0: the head goes back to 0
    cells.decode(0, [6, 7, 8], n_ubatch=8)  # from 0: empty, then 1 and 2 (5 and 4 behind 6), before cells 6 and 7
    assert (cells.pos, cells.pos_min(0)) == ([6, 7, 8, 3, 4, 5, -1, -1], 3)


def test_overwriting_a_cell_purges_every_lower_position_of_its_sequence() -> None:
    cells = swa.Cells(6, window=2)
    cells.load(0, [3, 4, 5, 0, 1, 2])  # a saved state read back as one ubatch, in the order it was saved
    cells.decode(0, [6], n_ubatch=1)  # the head wraps to cell 0, position 3 (3 behind 6); 0, 1 and 2 go with it
    assert (cells.pos, cells.pos_min(0)) == ([6, 4, 5, -1, -1, -1], 4)


def test_a_live_slot_keeps_a_re_ask_that_diverges_inside_its_cells() -> None:
    # 2,073 positions in 768 cells: the slot holds 1,305..2,072; the re-ask diverges at 2,049, whose window
    # starts at 2,049 - 128 = 1,921 > 1,305: nothing needed is gone, so nothing is rolled back (16 = Q2)
    m = model()
    assert send(m, PROMPT) == (2066, "empty slot")
    assert [(c.n_tokens, c.pos_min) for c in m.slots[0].held.checkpoints] == [(1550, 782), (2062, 1294)]
    assert send(m, BOS + DOC + Q2) == (16, "kept 2049 tokens in slot")


def test_after_a_ram_round_trip_only_the_window_is_left_so_a_re_ask_returns_to_a_checkpoint() -> None:
    # b11434 writes a window state with only the positions within 128 of its last (1,945..2,072): the re-ask's
    # window (from 1,921) is no longer held, and the checkpoint search takes 1,550, 4 + n_ubatch before the end:
    # 2,065 - 1,549 = 516 (report A's re-ask on Gemma 3 270M at 4K read 510, at 8K 516)
    m = model()
    send(m, PROMPT)
    send(m, BOS + OTHER + Q1)
    assert send(m, PROMPT) == (5, "found in RAM cache; restored checkpoint at n_tokens=2062")
    assert send(m, BOS + DOC + Q2) == (516, "restored checkpoint at n_tokens=1550")


def test_a_build_that_writes_the_whole_window_keeps_the_re_ask_after_a_ram_round_trip() -> None:
    m = model(BEFORE_SWA_FIXES)
    send(m, PROMPT)
    send(m, BOS + OTHER + Q1)
    assert send(m, PROMPT) == (1, "found in RAM cache; kept 2066 tokens in slot")
    assert send(m, BOS + DOC + Q2) == (16, "kept 2049 tokens in slot")


def test_the_bounded_search_skips_checkpoints_past_the_divergence() -> None:
    # an edit at 1,025: both checkpoints (1,550 and 2,062) lie past it, so b11434 re-processes everything,
    # where 0.3.17 returns to 1,550 and keeps only the 1,025 tokens before the edit
    m = model()
    send(m, PROMPT)
    assert send(m, EDITED) == (2067, "forced full re-processing (no checkpoint before divergence)")
    before = model(BEFORE_SWA_FIXES)
    send(before, PROMPT)
    assert send(before, EDITED) == (2067 - 1025, "restored checkpoint at n_tokens=1550")


def test_swa_full_keeps_every_position_so_an_edit_keeps_its_prefix_but_not_after_a_ram_round_trip() -> None:
    # --swa-full: 4,096 cells and no window test on b11434, so the edit keeps the 1,025 tokens before it.
    # A RAM copy still holds only the window (1,945..2,072), and with no checkpoints (none are needed with a
    # full cache) the same edit after a round trip re-processes everything.
    m = model(**{"swa-full": True})
    assert m.streams[0].size == 4096
    send(m, PROMPT)
    assert send(m, EDITED) == (2067 - 1025, "kept 1025 tokens in slot")
    m.restart()
    send(m, PROMPT)
    send(m, BOS + OTHER + Q1)
    assert send(m, EDITED) == (2067, "found in RAM cache; forced full re-processing (no checkpoint before divergence)")
