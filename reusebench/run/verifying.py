"""Verifying a session's reused outputs: the no-reuse references nothing computed along the way, and the noise band
the outputs are judged against when one differs (the session's ``SessionSteps`` is a ``Verifying``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from reusebench.llama.client import ClientError, Completion
from reusebench.records import Extra, Record, Role
from reusebench.reuse.expectation import ServerModel
from reusebench.reuse.verification import Unjudged
from reusebench.run import noise
from reusebench.run.diagnosis import Diagnosis
from reusebench.run.launch import LaunchSpec
from reusebench.run.progress import Progress
from reusebench.run.recording import Recorder
from reusebench.run.references import ReferenceKeeper
from reusebench.run.requests import Request
from reusebench.run.session_server import SessionServer

BAND_PROMPTS = 2  # at most this many prompts measured for the noise band: the largest difference is the band


class Verifying:
    """The references and the noise band of a session's steps; what they read is the session's."""

    spec: LaunchSpec
    server: SessionServer
    recorder: Recorder
    progress: Progress
    diagnosis: Diagnosis
    references: ReferenceKeeper
    expectation: ServerModel
    noise: dict[str, float]
    last_slot: int
    _deadline: Callable[[int], float]
    _answered: Callable[[Record, Completion], None]

    def deferred_references(self) -> None:
        """The references nothing computed along the way: one ``cache_prompt: false`` call per prompt and LoRA, as
        soon as the state they overwrite is no longer needed (before a restart or a sleep), else at the end."""
        waiting = self.references.waiting()
        if waiting and not self.server.process.is_running():
            steps = sum(len(p.steps) for p in waiting)
            self.progress.say(f"{steps} measured step(s) left unverified: the server is gone before their references")
            return
        for pending in waiting:
            first = pending.steps[0][0]
            record = self.recorder.open(first.scenario, first.step, Role.REFERENCE, pending.request.endpoint,
                                        tokens=pending.request.tokens, lora=pending.request.lora, slot=self.last_slot)
            timeout = self._deadline(len(pending.request.tokens))
            try:
                reference, _ = pending.request.send(
                    False, self.progress.callback(first.scenario, first.step, Role.REFERENCE), timeout)
            except ClientError as exc:
                self.progress.clear()
                raise self.diagnosis.fail(record, exc) from exc
            self.progress.clear()
            self._answered(record, reference)
            # a reference overwrites the slot like any request
            self.expectation.complete(pending.request.tokens, lora=pending.request.lora,
                                      user_starts=pending.request.user_starts, images=pending.request.images,
                                      cache_prompt=False)
            self.expectation.answered(reference.tokens)
            self.references.use(record, reference)
            self.recorder.write(record)
            self.progress.done(record)

    def noise_band(self) -> None:
        """When a reused output is not identical to its reference: the noise band of this model and build
        (``noise.measure``: the session's server restarted at another ubatch, after the session is done with it),
        from up to BAND_PROMPTS waiting prompts, each a recorded call. The steps are judged against the band
        (``verification.judge``); the band's last record carries their verdicts."""
        waiting = self.references.unjudged()
        if not waiting:
            return
        steps = sum(len(w.steps) for w in waiting)
        if not self.server.process.is_running():
            self.progress.say(f"{steps} reused output(s) left unjudged: the server is gone before the noise band")
            return

        band_prompts = waiting[:BAND_PROMPTS]
        tokens = sum(len(p.request.tokens) for p in band_prompts)
        took = self.progress.estimate.of(tokens) if self.progress.estimate else ""

        def announce(n_ubatch: int) -> None:
            self.progress.say(f"  {steps} reused output(s) differ from no reuse: measuring the noise band at ubatch "
                              f"{n_ubatch} (the session's: {self.spec.launch.n_ubatch}): a restart and "
                              f"{len(band_prompts)} prompt(s), {tokens:,} tokens" + (f", {took}" if took else ""))

        records: list[Record] = []  # the band's calls, in order

        def again(prompt: Unjudged[Request]) -> Completion:
            first = prompt.steps[0][0]
            record = self.recorder.open(first.scenario, first.step, Role.NOISE, prompt.request.endpoint,
                                        tokens=prompt.request.tokens, lora=prompt.request.lora, slot=self.last_slot)
            try:
                alternative, _ = prompt.request.send(
                    False, self.progress.callback(first.scenario, first.step, Role.NOISE),
                    self._deadline(len(prompt.request.tokens)))
            except ClientError as exc:
                self.progress.clear()
                raise self.diagnosis.fail(record, exc) from exc
            self.progress.clear()
            self._answered(record, alternative)
            records.append(record)
            return alternative

        measured = noise.measure(self.server, self.spec.launch.n_ubatch,
                                 [(p.reference, partial(again, p)) for p in band_prompts], announce=announce)
        for record, sample in zip(records, measured.samples):
            record.extra.update(Extra(n_ubatch=measured.n_ubatch, band_sample=sample))
        checks = [check for _, done in self.references.settle(measured.band) for check in done]
        records[-1].extra.update(Extra(noise_band=measured.band, verifies=checks))
        for record in records:
            self.recorder.write(record)
        self.noise = {"noise_band": measured.band, "n_ubatch": measured.n_ubatch, "tokens": measured.prefilled}
