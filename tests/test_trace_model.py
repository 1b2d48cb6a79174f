"""The reuse model on a trace's runs of blocks (``reuse.segments``, ``reuse.prompt_cache``'s index) predicts what it
predicts on the same prompts as plain token ids, where every entry of the RAM cache is compared: the fast path
that makes a 145M-token trace possible changes no count. Pure: no server."""

from __future__ import annotations

import os

import pytest

from reusebench.capability import PINNED
from reusebench.reuse.expectation import ServerModel
from reusebench.reuse.server_inputs import Launch, Memory
from reusebench.trace.mooncake import TraceSelection
from reusebench.trace.prompts import BlockIds, Vocabulary, trace_prompts
from reusebench.whatif import prediction

LAUNCHES = {
    "4 unified slots": Launch(n_ctx=4 * 9000, n_batch=256, n_ubatch=64),
    "2 slots, RAM cache": Launch(n_ctx=2 * 9000, n_slots=2, kv_unified=False, n_batch=256, n_ubatch=64),
    "1 slot, no RAM cache": Launch(n_ctx=9000, n_slots=1, cache_ram_mib=0, cache_idle_slots=False, n_batch=256,
                                   n_ubatch=64),
}


@pytest.mark.parametrize("pool", [3, 4096], ids=["3 ids: blocks share ids by chance", "4096 ids"])
@pytest.mark.parametrize("kind", ["hybrid", "attention"])
@pytest.mark.parametrize("launch", list(LAUNCHES), ids=list(LAUNCHES))
def test_runs_of_blocks_predict_what_token_ids_do(pool: int, kind: str, launch: str) -> None:
    _, trace = TraceSelection("mooncake-conversation", scale=16, start=3000, limit=250).load()
    blocks = BlockIds(Vocabulary(tuple(range(10, 10 + pool)), answer=5), trace.block_tokens)
    prompts = trace_prompts(trace, blocks)
    fast = ServerModel(Memory(kind, can_shift=True), LAUNCHES[launch], PINNED)
    plain = ServerModel(Memory(kind, can_shift=True), LAUNCHES[launch], PINNED)
    for p in prompts:
        tokens = blocks.tokens(p.prompt)
        assert fast.complete(p.prompt) == plain.complete(tokens), p.index
        answer = blocks.answer(p.n_predict)
        fast.answered(answer)
        plain.answered(blocks.tokens(answer))
    assert len(fast.ram) == len(plain.ram)


def test_whatif_s_children_answer_in_launch_order_and_their_failures_are_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # forked children inherit the stand-in predictor (the reuse model's part is the tests above): five launches,
    # two children at a time, answers back in launch order; an error in a child is raised in the parent, and a
    # child that dies without answering names its launch and exit status
    def stand_in(prompts: object, blocks: object, spec: int) -> int:
        if spec == 30:
            raise ValueError("launch thirty")
        if spec == 40:
            os._exit(7)
        return spec * 2

    monkeypatch.setattr(prediction, "_predict_one", stand_in)
    assert prediction._predict_all([], None, [1, 2, 3, 4, 5], 2) == [2, 4, 6, 8, 10]  # type: ignore[arg-type, list-item]
    with pytest.raises(ValueError, match="launch thirty"):
        prediction._predict_all([], None, [1, 30, 3], 2)  # type: ignore[arg-type, list-item]
    with pytest.raises(RuntimeError, match=r"launch 2 ended without an answer \(exit status 7\)"):
        prediction._predict_all([], None, [1, 40], 2)  # type: ignore[arg-type, list-item]
