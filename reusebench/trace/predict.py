"""What a server should re-process of every request of a trace, sent one at a time in trace order: the reuse model
run alone over the trace's prompts (``trace.prompts``), each answer the forced one of its output length.

The replay's ``expected`` and every ``whatif`` combination come from here, so a prediction is checked by a replay
of the same prompts. A request longer than a slot's context is left out, as the replay leaves it out, and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from reusebench.records import Served
from reusebench.reuse.expectation import Expected, ServerModel
from reusebench.trace.prompts import BlockIds, TracePrompt


@dataclass
class Prediction:
    """One launch's prediction over a trace."""

    expected: list[Expected | None] = field(default_factory=list)  # per prompt; None: too long, left out
    reprocessed: int = 0  # tokens re-processed, over the requests predicted
    ideal: int = 0  # what the trace's own unbounded prefix cache re-processes of them
    excess_by_class: Counter[Served] = field(default_factory=Counter)  # tokens over the ideal, by where served
    too_long: int = 0

    @property
    def excess(self) -> int:
        return self.reprocessed - self.ideal


def fits(prompt: TracePrompt, slot_context: int) -> bool:
    """Whether a slot of `slot_context` tokens holds the prompt and its answer."""
    return prompt.request.input_length + prompt.n_predict <= slot_context


def predict(prompts: Sequence[TracePrompt], model: ServerModel, blocks: BlockIds, slot_context: int) -> Prediction:
    """Feed every prompt that fits to `model` (fresh, of the launch predicted) in order, with its forced answer."""
    found = Prediction()
    for p in prompts:
        if not fits(p, slot_context):
            found.expected.append(None)
            found.too_long += 1
            continue
        expected = model.complete(p.prompt)
        model.answered(blocks.answer(p.n_predict))
        found.expected.append(expected)
        found.reprocessed += expected.prompt_n
        found.ideal += p.ideal
        if expected.prompt_n > p.ideal:
            found.excess_by_class[expected.served] += expected.prompt_n - p.ideal
    return found
