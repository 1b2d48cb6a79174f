"""One generated case of the differential fuzzer: a model of one memory family, a launch, and serial traffic.

A case is data, written as JSON: what a shrunk difference is kept as (``tests/data/fuzz/``) and what the fuzzer
replays. Prompts are runs of blocks (``trace.prompts.BlockIds``: a block id gives the same token ids every time,
id -1 is the forced answer token), so two prompts share exactly the prefix their runs share, and the reuse model
reads them as it reads a replayed trace. No text anywhere: ids and lengths only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reusebench.config.options import OptionValue

# The memory families of docs/llama-server-reuse.md, each with a tiny model of it (``reusebench.tiny``).
FAMILIES = {
    "attention": "llama",
    "window": "gemma3",
    "chunked-window": "arch-llama4",
    "recurrent": "arch-mamba2",
    "hybrid": "granitehybrid",  # its attention can shift: --cache-reuse stays on
    "hybrid-no-shift": "qwen35",  # multi-position RoPE: --cache-reuse is turned off
    "windowed-hybrid": "arch-lfm2",
}
WINDOWED = frozenset({"window", "chunked-window", "windowed-hybrid"})

Runs = tuple[tuple[int, int], ...]  # (block id, tokens of it)


class CaseFileError(ValueError):
    """A case file that cannot be read; the message names the file and the step."""


@dataclass(frozen=True)
class Send:
    """A completion: the prompt's runs and how many tokens its forced answer has."""

    runs: Runs
    n_predict: int

    @property
    def length(self) -> int:
        return sum(n for _, n in self.runs)


@dataclass(frozen=True)
class SlotAction:
    """`POST /slots/N?action=save|restore|erase`; a restore reads the file of save number `file`."""

    action: str  # "save", "restore", "erase"
    slot: int
    file: int = 0


Step = Send | SlotAction


@dataclass(frozen=True)
class Case:
    family: str
    options: dict[str, OptionValue] = field(hash=False)  # llama-server's long option names, ctx-size always set
    steps: tuple[Step, ...]
    block_tokens: int

    @property
    def model(self) -> str:
        return FAMILIES[self.family]

    @property
    def saves_slots(self) -> bool:
        return any(isinstance(s, SlotAction) for s in self.steps)

    def describe(self) -> str:
        """One line per step, for a report: lengths and shared runs, never token ids."""
        lines = [f"{self.family} ({self.model}): " + " ".join(
            f"--{k}" if v is True else f"--{k} {v}" for k, v in sorted(self.options.items()))]
        for i, step in enumerate(self.steps, 1):
            if isinstance(step, Send):
                blocks = " ".join("A" if b < 0 else f"{b}" if n == self.block_tokens else f"{b}[:{n}]"
                                  for b, n in step.runs)
                lines.append(f"  {i}. send {step.length} tokens ({blocks}), answer {step.n_predict}")
            else:
                lines.append(f"  {i}. {step.action} slot {step.slot}" + (
                    f" (file {step.file})" if step.action != "erase" else ""))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        for step in self.steps:
            if isinstance(step, Send):
                steps.append({"send": [list(r) for r in step.runs], "n_predict": step.n_predict})
            else:
                steps.append({step.action: step.slot, "file": step.file})
        return {"family": self.family, "model": f"tiny:{self.model}", "options": self.options,
                "block_tokens": self.block_tokens, "steps": steps}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "case") -> Case:
        try:
            family = data["family"]
            if family not in FAMILIES:
                raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)}")
            steps: list[Step] = []
            for number, step in enumerate(data["steps"], 1):
                if "send" in step:
                    steps.append(Send(tuple((int(b), int(n)) for b, n in step["send"]), int(step["n_predict"])))
                    continue
                action = next((a for a in ("save", "restore", "erase") if a in step), None)
                if action is None:
                    raise ValueError(f"step {number}: expected send, save, restore or erase")
                steps.append(SlotAction(action, int(step[action]), int(step.get("file", 0))))
            return cls(family, dict(data["options"]), tuple(steps), int(data["block_tokens"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CaseFileError(f"{where}: {exc}") from None

    @classmethod
    def read(cls, path: Path) -> Case:
        try:
            return cls.from_json(json.loads(path.read_text()), str(path))
        except json.JSONDecodeError as exc:
            raise CaseFileError(f"{path}: not JSON ({exc})") from None
        except OSError as exc:
            raise CaseFileError(f"{path}: {exc.strerror}") from None
