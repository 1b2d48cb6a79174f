"""What a ``scenarios.Steps`` reads from its variant and its build, shared by the session (``steps``) and the plan
(``plan``)."""

from __future__ import annotations

from reusebench.capability.rules import Capabilities
from reusebench.config import corpus as corpus_mod
from reusebench.config.profiles import Variant


class VariantSteps:
    """The variant's options, its adapters, its build's capabilities and the prompt format, as a scenario sees
    them."""

    variant: Variant
    capabilities: Capabilities  # the build's, where builds differ (``reusebench.capability``)

    @property
    def lora_adapters(self) -> int:
        return len(self.variant.lora)

    @property
    def multimodal(self) -> bool:
        return self.variant.mmproj is not None

    @property
    def slot_actions(self) -> bool:
        """Whether the server takes slot saves, restores and erases (a build may refuse them with an mmproj)."""
        return not self.multimodal or self.capabilities.holds("mmproj_slot_actions")

    def option(self, name: str) -> object | None:
        return self.variant.option(name)

    def number(self, name: str) -> float | None:
        return self.variant.number(name)

    def prompt(self, document: str, question: str) -> str:
        return corpus_mod.Corpus.prompt(document, question)
