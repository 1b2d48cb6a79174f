"""One session: one profile variant at one size, on one server, all scenarios in order.

The session runs the scenarios on ``steps.SessionSteps`` and decides what a failure means; its parts each do
one job: ``session_server`` (the server's lifetime), ``requests`` (building requests), ``references`` (the
no-reuse references), ``diagnosis`` (why a call failed, and deadlines), ``progress`` (the terminal), and the
recording core ``recording`` (one record per HTTP call, written as soon as it ends). A scenario that cannot
run on the variant (no sleep configured, no LoRA loaded) is announced with its reason and records nothing.

Faults: every completion has a deadline scaled from the prefill rate the first load measured and the prompt's
size; a call that fails (the server died, hung, answered an error) is recorded with the server's exit status
and a scrubbed log tail, the process group of a hung server is killed, and the session stops
(``OnFailure.STOP``, the default) or restarts the server and goes on with the next scenario
(``"continue"``). Every record written before stays as it is.

References (``verification.References``; "the same output" is ``verification.judge``): a reused
step whose prompt has no no-reuse computation yet is written at once and verified later: by any later call
that computes the same prompt and LoRA with nothing reused (a cold measured step is a reference), or by a
``cache_prompt: false`` call at the end of the session. The record that verifies lists the steps in
``extra["verifies"]``; ``records.read_records`` applies the verdicts. This keeps the prefill budget (all
prefilled tokens over the measured steps' own) as low as verification allows, and a reference never changes
the server state a later scenario starts from.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TextIO

from reusebench.budget import PrefillBudget
from reusebench.config import corpus as corpus_mod
from reusebench.config import scenarios
from reusebench.config.profiles import Variant
from reusebench.llama.client import ClientError, recorded_error
from reusebench.llama.process import ServerError
from reusebench.machine.gpu import GpuSampler
from reusebench.records import RecordWriter, Role
from reusebench.run.launch import LaunchSpec
from reusebench.run.loop import RunResult, ServerLoop
from reusebench.run.plan import Estimate
from reusebench.run.progress import Progress, ProgressHook
from reusebench.run.recording import Recorder, RunDir, Source
from reusebench.run.session_server import SessionServer
from reusebench.run.settings import DEFAULT, RunSettings
from reusebench.run.steps import SessionSteps


class OnFailure(StrEnum):
    """What a session does after a failed step: stop, or restart its server and go on with the next scenario."""

    STOP = "stop"
    CONTINUE = "continue"



@dataclass(frozen=True)
class RunShared:
    """What every session of one run writes to and reads from: the run's records file and directory, its GPU
    sampler, the progress stream and the estimate of the time left."""

    writer: RecordWriter
    run: RunDir
    sampler: GpuSampler
    out: TextIO = sys.stderr
    estimate: Estimate | None = None
    settings: RunSettings = DEFAULT


def session_name(variant: Variant, size: int, repeat: int | None = None) -> str:
    """"profile/variant@size", with "#rN" for the Nth of repeated sessions (--repeat-first-load)."""
    return f"{variant.profile}/{variant.name}@{size}" + ("" if repeat is None else f"#r{repeat}")


@dataclass
class SessionResult(RunResult):
    session: str
    stopped_by: str = field(default="every scenario run", kw_only=True)
    not_applicable: dict[str, str] = field(default_factory=dict)  # scenario id -> why it did not run
    error: str | None = None  # the first failure (with OnFailure.CONTINUE the session went on after it)
    failures: list[str] = field(default_factory=list)
    budget: PrefillBudget | None = None
    timing: dict[str, float] = field(default_factory=dict)  # wall, server, load, wait, overhead seconds
    noise: dict[str, float] = field(default_factory=dict)  # the noise band, when one was measured

    @property
    def overhead_fraction(self) -> float | None:
        wall = self.timing.get("wall_s")
        return self.timing["overhead_s"] / wall if wall else None

    def summary_line(self) -> str:
        """The prefill budget and the harness overhead, one line."""
        budget = self.budget.line() if self.budget else f"{self.session}: prefill budget n/a"
        fraction = self.overhead_fraction
        overhead = "" if fraction is None else (f"; harness overhead {self.timing['overhead_s']:.2f} s of "
                                                f"{self.timing['wall_s']:.1f} s ({100 * fraction:.1f}%)")
        band = "" if not self.noise else (f"; noise band {self.noise['noise_band']:.2g} ({self.noise['tokens']:,.0f} "
                                          f"tokens at ubatch {self.noise['n_ubatch']:.0f}, not in the budget)")
        return budget + band + overhead


class Session(ServerLoop):
    """Runs the scenarios of one variant at one size in order, through the run loop, and applies the failure
    policy: a failed step is a finding of the result, not an error."""

    def __init__(
        self,
        spec: LaunchSpec,
        size: int,
        corpus_spec: corpus_mod.CorpusSpec,
        shared: RunShared,
        *,
        selected: Sequence[scenarios.Scenario],
        repeat: int | None = None,
        on_failure: OnFailure = OnFailure.STOP,
        progress_hook: ProgressHook | None = None,
    ) -> None:
        self.size, self.on_failure = size, on_failure
        self.repeat = repeat  # which of several repeated sessions this is (--repeat-first-load), else None
        self.name = session_name(spec.variant, size, repeat)
        self.session_server = SessionServer(spec, shared.sampler)
        recorder = Recorder(shared.writer, Source.of(spec.variant), run=shared.run, session=self.name, size=size,
                            extra={} if repeat is None else {"repeat": repeat}, speculative=spec.launch.speculative)
        super().__init__(spec, self.session_server, recorder, session=self.name,
                         log_name=self.name.replace("/", "_").replace("@", "_"), out=shared.out)
        self.progress = Progress(self.name, shared.out, progress_hook, shared.estimate)
        self.steps = SessionSteps(spec, corpus_spec, self.session_server, self.recorder, self.progress,
                                  claim_wait_s=shared.settings.claim_wait_s(alone=True))
        self.result: SessionResult = SessionResult(self.name, records=self.steps.measured)
        self.selected = selected

    def run(self) -> SessionResult:
        super().run()
        return self.result

    def _start_server(self) -> None:
        self.session_server.check_slot_dir()
        self.session_server.start()

    def _drive(self) -> None:
        self.steps.build_corpus(self.size)
        for scenario in self.selected:
            reason = scenario.not_applicable(self.steps)
            if reason:
                self.result.not_applicable[scenario.id] = reason
                self.progress.say(f"{scenario.id}: not applicable to this variant, nothing recorded: {reason}")
                continue
            self.progress.say(f"{scenario.id}: {scenario.title}")
            try:
                scenario.run(self.steps)
            except (ClientError, ServerError) as exc:
                self._failed(f"{scenario.id}: ", exc)
                if self.on_failure is OnFailure.STOP:
                    break
                self.steps.recover()
        self.steps.deferred_references()
        self.steps.noise_band()

    def _absorbed(self, exc: BaseException) -> bool:
        if isinstance(exc, (ClientError, ServerError)):  # a CorpusError (bad input) ends the run: see cli
            self._failed("", exc)
            return True
        return False

    def _failed(self, where: str, exc: ClientError | ServerError) -> None:
        """A failure as the summary record keeps it (no server's words: ``recorded_error``) and as the console says
        it (with them)."""
        error = f"{where}{type(exc).__name__}: {recorded_error(exc)}"
        self.result.failures.append(error)
        self.result.error = self.result.error or error
        what = "going on with the next scenario" if self.on_failure is OnFailure.CONTINUE else "session stopped"
        self.progress.say(f"{what}: {where}{type(exc).__name__}: {exc}")

    def _summary(self, started_at: float) -> None:
        """The prefill budget and the harness overhead (wall time not spent by the server or waiting on purpose),
        said in one line and kept as the session's summary record (role "session", no HTTP call)."""
        if self.progress.estimate is not None:
            self.progress.estimate.session_ended(self.name)
        wall_s = self.result.wall_s
        budget = self.result.budget = self.recorder.budget()
        self.result.noise = self.steps.noise
        seconds = {"server": self.steps.server_s, "load": self.session_server.load_s, "wait": self.steps.wait_s}
        self.result.timing = {"wall_s": wall_s, **{f"{k}_s": v for k, v in seconds.items()},
                              "overhead_s": max(0.0, wall_s - sum(seconds.values())), **self.steps.corpus_timing}
        self.progress.say(self.result.summary_line().removeprefix(f"{self.name}: "))
        if self.session_server.process.starts == 0:
            return  # failed before launch: no call was made, nothing to sum up
        self.recorder.summary(Role.SESSION, started_at, wall_s, {
            "timing": self.result.timing, "prefill": budget.to_dict(), "failures": self.result.failures,
            "not_applicable": self.result.not_applicable, "noise": self.steps.noise}, slot=self.steps.last_slot)
