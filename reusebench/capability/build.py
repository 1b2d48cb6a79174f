"""One llama-server binary as every driver sees it, resolved once: ``Build``.

A driver needs four facts of the binary it starts: the options its ``--help`` lists, its rules where builds
differ (``Capabilities``, probed once and kept by executable hash), the memory it builds for a model (one
short start, kept per binary and model file) and the bytes of a slot's state of that model (another). ``of`` gathers them for one binary; ``launch.resolve`` takes the
result, so the rules a spec predicts with are always its own binary's. The pinned build is one ``Build`` among
others: a binary whose probes cannot run gets the pinned rules, with why in ``capabilities.how``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reusebench.capability import Capabilities, cache, learned_memory, state_bytes
from reusebench.capability.build_probes import Say
from reusebench.capability.state_bytes import StateBytes
from reusebench.llama import binaries
from reusebench.llama.binaries import Binary, HelpOption
from reusebench.llama.memory_log import ModelMemory


@dataclass(frozen=True)
class Build:
    """A llama-server binary, its ``--help`` table and its probed capabilities."""

    binary: Binary
    capabilities: Capabilities
    help: Mapping[str, HelpOption]

    @property
    def path(self) -> Path:
        return self.binary.path

    def memory(self, model: Path, say: Say = lambda _m: None) -> ModelMemory:
        """`model`'s memory as this binary builds it (``capability.learned_memory``: learned by one start, kept)."""
        return learned_memory.of_model(self.binary, model, say)

    def state_bytes(self, model: Path, memory: ModelMemory, cache_types: Mapping[str, str],
                    say: Say = lambda _m: None) -> StateBytes | None:
        """A slot's state of `model` in bytes as this binary counts them (``capability.state_bytes``: measured by one
        start, kept)."""
        return state_bytes.of_model(self.binary, model, memory, cache_types, say)


def of(binary: Binary, say: Say = lambda _m: None, *, again: bool = False) -> Build:
    """`binary` as a Build: its --help read, its capabilities cached or probed now (`again`: probed anew)."""
    return Build(binary, cache.of_binary(binary, say, again=again), binaries.help_table(binary))

