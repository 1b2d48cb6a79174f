"""What a llama-server build does where builds differ, as its probes showed it: ``Capabilities``, the pinned
build's (``PINNED``), the probes that show them (``build_probes``) and the cache by binary hash (``cache``).

llama.cpp changes its reuse rules between releases, and forks change them between releases. A build
number cannot say which rules hold, so each behaviour that differs between the builds we know is a
capability with a short probe (``reusebench.capability.build_probes``). The reuse model takes its rules from
these values. A value the probes could not show is None, and the pinned build's rule applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


def _rule(pinned: bool, words: str, concerns: str | None = None) -> Any:
    """One capability's declaration: not shown until probed (None), the pinned build's value, its words, and the
    launch feature it concerns (None: every launch)."""
    return field(default=None, metadata={"pinned": pinned, "words": words, "concerns": concerns})


# Launch features some rules concern; a launch without one has no use for those rules' lines in `check`.
MMPROJ, LORA, SLEEP = "an mmproj", "LoRA adapters", "sleep"


@dataclass(frozen=True)
class Capabilities:
    """One build's behaviour where llama.cpp builds differ; None: not shown (the pinned build's rule applies)."""

    # Saving a slot writes its context checkpoints into the file, and restoring reads them back (b11549).
    slot_file_checkpoints: bool | None = _rule(False, "slot files carry checkpoints")
    # A restore clears only the slot's tokens and keeps its in-memory checkpoints, whatever they were computed
    # from (2026-03): a re-ask after a restore can return to one, or to another document's.
    restore_keeps_slot_checkpoints: bool | None = _rule(False, "a restore keeps the slot's checkpoints")
    # Checkpoints within 64 tokens of the prompt's start or of the previous one are made (not 2026-03, which makes
    # none before 64 tokens and none closer than 64 to the last).
    close_checkpoints: bool | None = _rule(True, "checkpoints within 64 tokens of the start or each other")
    # A chat prompt gets a checkpoint where its last user message starts (from b10355).
    user_message_checkpoints: bool | None = _rule(True, "checkpoints at user messages (chat)")
    # /completion reads `message_delimiters`, so a token prompt can mark its user messages (before b11549).
    completion_message_delimiters: bool | None = _rule(True, "/completion takes message_delimiters")
    # A slot can be saved, restored and erased while an mmproj is loaded (not 2026-03, which refuses every slot
    # action then, HTTP 501).
    mmproj_slot_actions: bool | None = _rule(True, "slot save, restore and erase with an mmproj loaded", MMPROJ)
    # The batch right after an image gets a checkpoint like any other (not b11434: "do not checkpoint after mtmd
    # chunks", so an image within a prompt's last 4 tokens sends a resend back before it).
    checkpoint_after_image: bool | None = _rule(False, "a checkpoint right after an image", MMPROJ)
    # A prompt that extends everything a recurrent slot holds is tested like one that diverges, so the slot goes back
    # to a checkpoint, or re-reads everything where it has none, as after a restore (b9246 to b9496: the test took
    # `n_past <= n_tokens` with a threshold one lower before b9509's `has_new_tokens` let an extension through).
    extension_returns_to_checkpoint: bool | None = _rule(False, "a prompt extending all the slot holds goes back "
                                                                "to a checkpoint")
    # A slot that holds nothing (erased, just started) takes a matching RAM prompt-cache entry (not 2026-03, which
    # updates the cache only for a slot with tokens).
    empty_slot_loads_from_ram: bool | None = _rule(True, "an empty slot loads from the RAM cache")
    # A RAM prompt-cache entry keeps the LoRA it was computed with, and a restore takes only a matching one
    # (report B's fix; none of the releases).
    ram_cache_keeps_lora: bool | None = _rule(False, "RAM cache entries keep their LoRA", LORA)
    # GET /metrics wakes a sleeping server (none of the releases: /metrics and /props do not, /slots does).
    metrics_wakes_sleeping: bool | None = _rule(False, "GET /metrics wakes a sleeping server", SLEEP)
    # The checkpoint search skips checkpoints past the divergence, takes one that starts at position 0, and tests
    # an identical prompt one position stricter (from 2026-10-01; 2026-03 takes any checkpoint that starts below
    # the threshold). It decides sliding-window models: a recurrent checkpoint starts where it ends.
    checkpoint_search_bounded: bool | None = _rule(True, "checkpoints past the divergence are never restored")
    # A saved sliding-window state (a checkpoint, a RAM cache entry, a slot file) holds only the window, so once
    # loaded it cannot serve a prompt without a checkpoint (from 2026-10-01; 2026-03 keeps every cell).
    swa_state_window_only: bool | None = _rule(True, "a saved sliding-window state holds only the window")
    # --swa-full makes the server treat the model as one without a window (from 2026-10-01; 2026-03 still tests a
    # shared prefix against the window, so one no longer than the window is re-processed).
    swa_full_drops_window: bool | None = _rule(True, "--swa-full drops the window from the reuse test")
    # What each probe saw: counts, and the server's own error where it refused: {capability: evidence}.
    evidence: Mapping[str, str] = field(default_factory=dict, compare=False)
    how: str = "not probed"  # "probed", "probed (cached)", or "not probed: why"

    @property
    def rules(self) -> Capabilities:
        """The rules the reuse model applies, as typed attributes: each probed value, else the pinned build's."""
        pinned: dict[str, Any] = {name: PINNED_RULES[name] for name in NAMES if getattr(self, name) is None}
        return replace(self, **pinned)

    def values(self) -> dict[str, bool | None]:
        return {name: getattr(self, name) for name in NAMES}

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "evidence": dict(self.evidence)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, how: str | None = None) -> Capabilities:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown capabilities {', '.join(unknown)}")
        found = cls(**{**data, "evidence": dict(data.get("evidence") or {})})
        return found if how is None else replace(found, how=how)

    def describe(self) -> str:
        """One line for a report or a record's build: "slot files carry checkpoints: yes; ... (probed)"."""
        said = "; ".join(f"{WORDS[name]}: {_word(value)}" for name, value in self.values().items())
        return f"{said} ({self.how})"

    def lines(self, uses: frozenset[str] | None = None) -> list[str]:
        """One line per capability for `check` and `probe`: "this build: slot files carry checkpoints: no, probed
        (evidence)". With `uses` (the launch's features), only the rules that concern it, and a last line naming
        the features whose rules were left out; an evidence two rules share is quoted once."""
        unshown = "not shown by its probe" if self.how.startswith("probed") else "not probed"
        found, quoted, left_out = [], set(), []
        for name, value in self.values().items():
            concerns = CONCERNS[name]
            if uses is not None and concerns is not None and concerns not in uses:
                left_out.append(concerns)
                continue
            said = "probed" if value is not None else f"{unshown}: b11434's rule applies"
            seen = self.evidence.get(name)
            evidence = "" if seen is None else " (the same probe as above)" if seen in quoted else f" ({seen})"
            quoted.add(seen)
            found.append(f"this build: {WORDS[name]}: {_word(getattr(self.rules, name))}, {said}{evidence}")
        if left_out:
            found.append(f"this build: {len(left_out)} rule(s) about {', '.join(dict.fromkeys(left_out))} left out, "
                         f"which this launch does not use (`reusebench probe` lists every rule)")
        return found

    def label(self) -> str:
        """What a record's build says of its rules: "rules probed: as b11434", or the ones that differ."""
        if self.how.startswith("not probed"):
            return "rules not probed: b11434's"
        differ = self.differences()
        return f"rules probed: {'; '.join(differ) if differ else 'as b11434'}"

    def differences(self) -> list[str]:
        """The rules where this build differs from the pinned one, in words."""
        return [f"{WORDS[name]}: {_word(value)}" for name, value in self.values().items()
                if value is not None and value != PINNED_RULES[name]]


# The pinned build's (b11434's) rules, which apply where a probe showed nothing, and each rule in words: from the
# one declaration of each field.
PINNED_RULES: dict[str, bool] = {f.name: f.metadata["pinned"] for f in fields(Capabilities) if "pinned" in f.metadata}
WORDS: dict[str, str] = {f.name: f.metadata["words"] for f in fields(Capabilities) if "words" in f.metadata}
CONCERNS: dict[str, str | None] = {f.name: f.metadata["concerns"] for f in fields(Capabilities) if "words" in f.metadata}
NAMES: tuple[str, ...] = tuple(PINNED_RULES)
PINNED = Capabilities(**PINNED_RULES, how="not probed: the pinned build's rules")  # type: ignore[arg-type]  # bool fields


def features(*, mmproj: bool, lora: bool, sleeps: bool) -> frozenset[str]:
    """The features of a launch that some rules concern (``Capabilities.lines``)."""
    return frozenset(name for name, used in ((MMPROJ, mmproj), (LORA, lora), (SLEEP, sleeps)) if used)


def _word(value: bool | None) -> str:
    return "not shown" if value is None else "yes" if value else "no"
