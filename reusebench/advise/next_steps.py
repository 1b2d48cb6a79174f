"""What a finished run suggests doing next, where its misses point at a launch option the suite knows.

`run` prints these after its tables. A should-hit step that re-processed everything is the sign; what the
suite knows to help is the same knowledge ``inspect`` and ``advise`` use: a model that keeps only a window
loses what lies before it on every restore (``--swa-full`` keeps it), and ``advise`` tries the changes that
matter for the profile's model.
"""

from __future__ import annotations

from collections.abc import Sequence

from reusebench.capability import build
from reusebench.config.profiles import Profile
from reusebench.records import Record, Role, StepVerdict, outcome


def next_steps(profile: Profile, measured: Sequence[Record]) -> list[str]:
    """One line per suggestion, none when every step that should hit did."""
    missed = [r for r in measured if r.role == Role.MEASURE and not r.error and r.expected_hit is not False
              and outcome(r) == StepVerdict.MISS]
    if not missed:
        return []
    ran = {r.variant for r in missed}
    said = []
    for variant in profile.variants:
        if variant.name not in ran or variant.option("swa-full"):
            continue
        memory = build.of(variant.binary).memory(variant.model)  # read once per binary and model, kept
        if memory.window_layers:
            said.append(f"next ({variant.name}): the model keeps only a {memory.window:,}-token window on "
                        f"{memory.window_layers} of {memory.n_layer} layers, so what a slot file or the RAM cache "
                        f"holds of a longer prompt cannot serve it; `swa-full: true` keeps every cell "
                        f"(`reusebench inspect {variant.model} --profile {profile.path}` says what it changes)")
    steps = ", ".join(dict.fromkeys(f"{r.scenario}/{r.step}" for r in missed))
    said.append(f"next: `reusebench advise --profile {profile.path}` tries the launch changes that matter for the "
                f"{len(missed)} step(s) that should have hit and re-processed everything ({steps})")
    return said
