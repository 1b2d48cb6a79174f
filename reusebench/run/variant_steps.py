"""What a ``scenarios.Steps`` reads of its launch, shared by the session (``steps``) and the plan (``plan``): all of
it from the session's ``LaunchSpec``."""

from __future__ import annotations

from reusebench.capability import Capabilities
from reusebench.config import corpus as corpus_mod
from reusebench.run.launch import LaunchSpec


class VariantSteps:
    """The launch's slots, adapters, sleep, build capabilities and the prompt format, as a scenario sees them."""

    spec: LaunchSpec
    corpus_spec: corpus_mod.CorpusSpec

    @property
    def capabilities(self) -> Capabilities:
        return self.spec.capabilities

    @property
    def lora_adapters(self) -> int:
        return self.spec.launch.lora_adapters

    @property
    def multimodal(self) -> bool:
        return self.spec.launch.multimodal

    @property
    def images(self) -> bool:
        return self.corpus_spec.images is not None

    @property
    def slot_actions(self) -> bool:
        return self.spec.slot_actions

    @property
    def n_slots(self) -> int:
        return self.spec.n_slots

    @property
    def ram_cache(self) -> bool:
        return self.spec.launch.cache_ram_mib != 0

    @property
    def sleep_idle_s(self) -> float | None:
        return self.spec.sleep_idle_s

    def may_stop(self, allowed: bool) -> bool:
        """Whether a step the scenario lets stop (`allowed`) may stop: the command line and the build decide
        (``LaunchSpec.early_stop``); ``plan.stops_at`` decides whether it does."""
        return allowed and self.spec.early_stop

    def prompt(self, document: str, question: str) -> str:
        return corpus_mod.Corpus.prompt(document, question)
