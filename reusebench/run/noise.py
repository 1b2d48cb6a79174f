"""The noise band (``reuse.verification``): how far a model's output moves when only the batch shape changes.

``measure`` restarts the caller's own server at an odd ubatch near a quarter of its launch's
(``verification.alternative_ubatch``), so never two servers at once, and computes each prompt there again without
reuse, against its no-reuse reference at the launch's ubatch. The band is the largest difference. The server is
left at the other ubatch: the caller restarts it as it was (``check``) or closes it (a session), and its own
``finally`` stops the process group on an error or Ctrl-C, as it does for any of its calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from reusebench.llama.client import Completion
from reusebench.llama.outputs import difference
from reusebench.reuse.verification import alternative_ubatch

# A prompt's no-reuse reference, and the call that computes the same prompt again with cache_prompt false
Recompute = tuple[Completion, Callable[[], Completion]]


class Restartable(Protocol):
    """A server that stops and starts again with `extra_args` after its launch line (a later option wins)."""

    def restart(self, extra_args: tuple[str, ...]) -> None: ...


@dataclass(frozen=True)
class NoiseBand:
    """The noise band as measured: at which ubatch, each prompt's difference (a sample), and the tokens it cost."""

    n_ubatch: int  # the other ubatch the references were computed again at
    samples: tuple[float, ...]  # each prompt's reference against the same at `n_ubatch`, in the prompts' order
    prefilled: int  # prompt tokens computed for the band (none of them a session's cost)

    @property
    def band(self) -> float:
        return max(self.samples)


def measure(server: Restartable, launch_ubatch: int, prompts: Sequence[Recompute], *,
            announce: Callable[[int], None] = lambda _n_ubatch: None) -> NoiseBand:
    """The noise band of `prompts` (at least one) on `server`, launched at `launch_ubatch`; `announce` is told the
    other ubatch before the restart."""
    n_ubatch = alternative_ubatch(launch_ubatch)
    announce(n_ubatch)
    server.restart(("--ubatch-size", str(n_ubatch)))
    samples, prefilled = [], 0
    for reference, compute in prompts:
        again = compute()
        samples.append(difference(reference, again).delta)
        prefilled += again.prompt_n
    return NoiseBand(n_ubatch, tuple(samples), prefilled)
