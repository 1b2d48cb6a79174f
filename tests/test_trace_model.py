"""The reuse model on a trace's runs of blocks (``reuse.segments``, ``reuse.prompt_cache``'s index) predicts what it
predicts on the same prompts as plain token ids, where every entry of the RAM cache is compared: the fast path
that makes a 145M-token trace possible changes no count. Pure: no server."""

from __future__ import annotations

import pytest

from reusebench.capability import PINNED
from reusebench.reuse.expectation import ServerModel
from reusebench.reuse.server_inputs import Launch, Memory
from reusebench.trace.mooncake import TraceSelection
from reusebench.trace.prompts import BlockIds, Vocabulary, trace_prompts

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
