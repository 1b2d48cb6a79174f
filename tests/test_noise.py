"""The noise band on a real llama-server (``run.noise.measure``), the one measurement `check` and a session share."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from reusebench import tiny
from reusebench.llama.client import Completion, TokenProbs
from reusebench.llama.server import Server
from reusebench.run import noise
from reusebench.run.noise import NoiseBand

from conftest import SLOW_MACHINE_S, default_llama_server

pytestmark = pytest.mark.e2e


def test_each_reference_against_its_prompt_again_at_the_other_ubatch_and_the_largest_is_the_band() -> None:
    args = ["-m", str(tiny.model_path("llama")), "-c", "1024", "-np", "1", "-b", "512", "-ub", "512"]
    with Server.of(default_llama_server(), args, call_timeout_s=SLOW_MACHINE_S) as server:
        def complete(prompt: list[int]) -> Completion:
            return server.client.complete(prompt, n_predict=4, n_probs=1, cache_prompt=False)

        first = server.client.tokenize(" ".join(tiny.WORDS[:12]), add_special=True)
        second = server.client.tokenize(" ".join(tiny.WORDS[12:30]), add_special=True)
        references = complete(first), complete(second)
        # the second prompt's reference made certain of its first token: probability 1 (logprob 0), all else alike
        top = references[1].probs[0]
        certain = replace(references[1], probs=[TokenProbs(top.id, 0.0, ((top.id, 0.0),)), *references[1].probs[1:]])
        started_with: list[list[str]] = []

        def again(prompt: list[int]) -> Completion:
            started_with.append(server.process.args[-2:])
            return complete(prompt)

        measured = noise.measure(server, 512, [(references[0], lambda: again(first)),
                                               (certain, lambda: again(second))])
        starts = server.process.starts
    # 512 // 4 = 128, even, so 127; one restart after the first start, and the server is left there for the caller
    assert started_with == [["--ubatch-size", "127"]] * 2 and starts == 2
    # Both prompts are shorter than 127 tokens, so one batch at either ubatch: the same computation, difference 0.
    # Against the certain reference only its first token moves: |1 - p| over the larger probability, 1, is 1 - p.
    p = math.exp(top.logprob)
    assert measured == NoiseBand(n_ubatch=127, samples=(0.0, 1.0 - p), prefilled=len(first) + len(second))
    assert measured.band == 1.0 - p > 0.0
