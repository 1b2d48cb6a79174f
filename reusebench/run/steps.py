"""The ``scenarios.Steps`` protocol on a running server: each step one call, recorded as it ends.

For every completion it works out what a perfect cache would have re-processed (``ideal``: the prompt tokens
after the longest prefix the server has already seen under the same LoRA setting), what the reuse model
expects (``expectation``), why the server did what it did (from its log), and the step's verdict.

Early stop: a measured step that the scenario lets stop (``may_stop``) is ended at the server's first
prompt-progress event, where ``total - cache`` is its count, when it would prefill more than
``plan.STOP_ABOVE_TOKENS`` and nothing needs its output: not a step whose reuse is checked against a no-reuse
reference, nor the reference a waiting step needs. Closing the stream cancels the task only when the server
next writes to it, a batch or two later, and the cancelled slot keeps a partial prompt of a length the client
does not know; so the slot is erased at once (the erase waits until the cancel is done, and tells how many
tokens the slot held), and no partial state reaches a later step or the RAM cache. Its prefill seconds are not
measured (``--full-prefills`` times every step to the end).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from reusebench.config import corpus as corpus_mod
from reusebench.config import images as images_mod
from reusebench.config import scenarios
from reusebench.llama.client import ClientError, Completion, ProgressCallback, StreamEnded
from reusebench.llama.outputs import common_prefix
from reusebench.llama.process import ServerError
from reusebench.llama.task_log import Task
from reusebench.records import DEFAULT_LORA, Extra, Lora, Record, Role, interrupted, lora_key, slot_answer, verdict
from reusebench.reuse import image_runs, server_state
from reusebench.reuse.perfect_cache import PerfectCache
from reusebench.run.diagnosis import Diagnosis, deadline_s
from reusebench.run.launch import LaunchSpec
from reusebench.run.plan import stops_at
from reusebench.run.progress import Progress
from reusebench.run.recording import Recorder
from reusebench.run.references import ReferenceKeeper
from reusebench.run.requests import Media, Prompt, Request, Requests
from reusebench.run.session_server import SessionServer
from reusebench.run.variant_steps import VariantSteps
from reusebench.run.verifying import Verifying

SLOT_LINE_WAIT_S = 5.0  # at most, for the log to name a stopped step's slot (it takes milliseconds)
IMAGE_PROBE_TAIL = " image"  # the text after the image whose tokens are measured
STOPPED = "not measured: stopped at the first progress event once its count was known (--full-prefills times it)"


class SessionSteps(VariantSteps, Verifying):
    """What a scenario can do (``scenarios.Steps``): measured and setup completions, chat turns, slot saves and
    restores, idling until asleep, restarts."""

    def __init__(self, spec: LaunchSpec, corpus_spec: corpus_mod.CorpusSpec, server: SessionServer, recorder: Recorder,
                 progress: Progress, *, claim_wait_s: float) -> None:
        self.spec, self.corpus_spec, self.server, self.recorder, self.progress = (spec, corpus_spec, server, recorder,
                                                                                 progress)
        self.requests = Requests(server, spec.variant.n_predict, whole=spec.launch.speculative)
        self.diagnosis = Diagnosis(server, recorder, claim_wait_s)
        self.references = ReferenceKeeper(spec.verify, progress)
        # what the server should do, request by request: from the GGUF, the launch options and the build's probed
        # capabilities only
        self.expectation = spec.reuse_model()
        self.server_s = 0.0  # the server's own prompt, generation and slot-file time
        self.wait_s = 0.0  # deliberate waits (idling until asleep)
        self.corpus_timing: dict[str, float] = {}
        self.noise: dict[str, float] = {}  # the noise band, its ubatch and its prefilled tokens, once measured
        self.last_slot = 0
        self._seen: dict[str, PerfectCache] = {}  # lora key -> what the server has processed under it
        self._slot_sequence: tuple[str, list[int]] = (DEFAULT_LORA, [])  # what the last slot used holds
        self._restored = False  # whether a slot file was restored since the last completion
        self._saved: dict[str, tuple[str, list[int]]] = {}
        self._expected_saved: dict[str, server_state.Held] = {}
        self._first_load_ms: float | None = None
        self._rate: float | None = None  # prefill tokens per second of the first load
        self.measured: list[Record] = []  # the measured and setup records, in order (the session's result)

    def build_corpus(self, size: int) -> None:
        building = time.monotonic()
        self.corpus = corpus_mod.build_corpus(self.corpus_spec, self.server.client, size)
        self.corpus_timing = {"corpus_s": time.monotonic() - building,
                              "corpus_tokenizer_calls": self.corpus.tokenizer_calls}
        if self.corpus.images:
            self._measure_images()

    def _measure_images(self) -> None:
        """The tokens the server gives each size of image: the image alone with a word after it (b11434 aborts on a
        prompt that ends with an image), without reuse, its slot erased after (a setup record each), so the first
        load still finds every slot empty. The reuse model and the perfect cache see these calls as the server did."""
        marker = self.server.client.media_marker()  # the same at every start: the launch pins it
        n_tokens: dict[int, int] = {}
        by_size: dict[tuple[int, int], int] = {}
        for index, image in enumerate(self.corpus.images):
            size = (image.width, image.height)
            if size not in by_size:
                by_size[size] = self._image_tokens(index, Media(self.corpus.images, {}, marker))
            n_tokens[index] = by_size[size]
        self.requests.media = Media(self.corpus.images, n_tokens, marker)

    def _image_tokens(self, index: int, media: Media) -> int:
        image = self.corpus.images[index]
        bos, after = self.tokens(""), self.tokens(IMAGE_PROBE_TAIL, bos=False)
        record = self.recorder.open("images", f"tokens of a {image.width}x{image.height} image", Role.SETUP,
                                    "/completion", tokens=None, slot=self.last_slot)
        record.extra["image"] = image.describe()
        completion = self.server.client.complete(media.prompt(images_mod.placeholder(index) + IMAGE_PROBE_TAIL),
                                                 n_predict=1, cache_prompt=False, timeout_s=self._deadline(len(bos)))
        self._answered(record, completion)
        self.recorder.write(record)
        n_image = completion.prompt_n - len(bos) - len(after)
        tokens = [*bos, *image_runs.run_ids(index, n_image), *after]
        self.expectation.complete(tokens, images=((len(bos), n_image),), cache_prompt=False)
        self.expectation.answered(completion.tokens)
        self._seen.setdefault(DEFAULT_LORA, PerfectCache()).add(tokens)
        slot = completion.id_slot if completion.id_slot is not None else self.last_slot
        self._call("images", "erase slot", f"/slots/{slot}?action=erase", lambda: self.server.client.slot_erase(slot))
        self.expectation.erase(slot)
        return n_image

    # -- the protocol: what scenarios read ------------------------------------------------------

    @property
    def document(self) -> str:
        return self.corpus.document

    @property
    def other(self) -> str:
        return self.corpus.other

    @property
    def edited(self) -> str:
        return self.corpus.edited

    @property
    def questions(self) -> tuple[str, str]:
        return self.corpus.questions

    @property
    def summary(self) -> str:
        return self.corpus_spec.summary

    def tokens(self, text: str, *, bos: bool = True) -> list[int]:
        return self.requests.tokens(text, bos=bos)

    def saved_tokens(self, filename: str) -> list[int]:
        """What the slot file holds: the prompt and the answer of the step before its save."""
        return list(self._saved[filename][1])

    # -- the protocol: what scenarios do --------------------------------------------------------

    def measure(self, scenario: str, step: str, prompt: Prompt, *, expect_hit: bool = True,
                lora: Lora = None, may_stop: bool = False) -> None:
        self._complete(scenario, step, Role.MEASURE, self.requests.completion(prompt, lora), expect_hit,
                       may_stop=self.may_stop(may_stop))

    def setup(self, scenario: str, step: str, prompt: Prompt, *, lora: Lora = None) -> Completion:
        completed = self._complete(scenario, step, Role.SETUP, self.requests.completion(prompt, lora), False)
        assert completed is not None  # only a measured step may stop
        return completed[0]

    def chat(self, scenario: str, step: str, messages: scenarios.Messages, *, expect_hit: bool = True) -> str:
        """A measured ``/v1/chat/completions`` turn; returns the reply text for the next turn (never recorded)."""
        completed = self._complete(scenario, step, Role.MEASURE, self.requests.chat(messages), expect_hit)
        assert completed is not None  # a chat turn's reply is the next turn's input: it never stops
        return completed[1]

    def save_slot(self, scenario: str, filename: str) -> None:
        self._saved[filename] = self._slot_sequence
        self._expected_saved[filename] = self.expectation.saved(self.last_slot)
        timeout = self._deadline(len(self._slot_sequence[1]))
        slot = self.last_slot
        try:
            self._call(scenario, "save slot", f"/slots/{slot}?action=save",
                       lambda: self.server.client.slot_save(slot, filename, timeout_s=timeout),
                       explain=lambda: self.diagnosis.save_failure(filename))
        except ClientError:
            del self._saved[filename]
            raise

    def restore_slot(self, scenario: str, filename: str) -> None:
        timeout = self._deadline(len(self._saved.get(filename, ("", []))[1]))
        slot = self.last_slot
        self._call(scenario, "restore slot", f"/slots/{slot}?action=restore",
                   lambda: self.server.client.slot_restore(slot, filename, timeout_s=timeout))
        key, sequence = self._saved[filename]
        self._slot_sequence = (key, sequence)
        self._restored = True  # the next completion finds the slot as the file left it
        self._seen.setdefault(key, PerfectCache()).add(sequence)
        self.expectation.restore(slot, self._expected_saved[filename])

    def wait_until_asleep(self, scenario: str) -> None:
        """Stay idle until the server sleeps (``Server.wait_until_asleep``); a server that does not fails."""
        self.deferred_references()  # sleep frees what they would overwrite: judged now, not at the end
        self.progress.say(f"  idling until the server sleeps (sleep-idle-seconds {self.spec.sleep_idle_s or 0.0:g})")

        def wait() -> dict[str, Any]:
            waited = self.server.wait_until_asleep()
            self.wait_s += waited.waited_s  # a deliberate wait, not harness overhead
            if not waited.asleep:
                raise ServerError(f"the server did not sleep within {waited.waited_s:.0f} s of idling")
            self.expectation.sleep()
            return {"n_polls": waited.polls}

        self._call(scenario, "idle until asleep", "/props", wait)

    def restart(self, scenario: str) -> None:
        self.deferred_references()  # the restart forgets what they would overwrite: judged now, not at the end
        self._restart("restarting the server (same slot-save directory)")
        self.expectation.restart()

    def recover(self) -> None:
        """After a failed scenario: a fresh server if the old one is gone, and a model of a fresh server."""
        if self.server.process.is_running():
            return
        self._restart("restarting the server after the failure")
        self._slot_sequence, self.last_slot = (DEFAULT_LORA, []), 0
        self.expectation.restart()

    def _restart(self, message: str) -> None:
        self.progress.say(f"  {message}")
        self.server.restart()
        self._slot_sequence = (DEFAULT_LORA, [])
        self._seen.clear()  # a perfect cache keeps only what was saved to disk across a restart

    # -- one call -------------------------------------------------------------------------------

    def _deadline(self, n_tokens: int) -> float:
        return deadline_s(n_tokens, self._rate, self.spec.variant.n_predict)

    def _ideal(self, tokens: list[int], key: str) -> int:
        """Tokens a perfect cache would re-process: those after the longest prefix already seen (at least 1)."""
        return self._seen.get(key, PerfectCache()).ideal(tokens)

    def _record(self, scenario: str, step: str, role: Role, endpoint: str, started: float) -> Record:
        return self.recorder.record(scenario, step, role, endpoint, started, slot=self.last_slot)

    def _call(self, scenario: str, step: str, endpoint: str, action: Callable[[], dict[str, Any]],
              explain: Callable[[], str] | None = None) -> dict[str, Any]:
        started = time.time()
        record = self._record(scenario, step, Role.SETUP, endpoint, started)
        try:
            response = action()
            record.extra.update(slot_answer(response))
        except ClientError as exc:
            why = explain() if explain and self.server.process.is_running() else ""
            raise self.diagnosis.fail(record, exc, why) from exc
        except ServerError as exc:
            self.recorder.cut_short(record, f"ServerError: {exc}")
            raise
        record.ended_at = time.time()
        record.wall_ms = (record.ended_at - started) * 1000.0
        # slot files are server work: their time is not harness overhead
        timings = response.get("timings") or {}
        self.server_s += sum(float(v) for k, v in timings.items() if k.endswith("_ms")) / 1000.0
        self.recorder.write(record)
        return response

    def _answered(self, record: Record, c: Completion) -> None:
        """The one end of a completion (``Recorder.answered``: figures, its task in the log, its cause); judged by the
        session itself (``_judge``), which knows the reuse model and the references."""
        self.recorder.answered(record, c, self._claim, judged=False)
        self.server_s += (c.prompt_ms + c.predicted_ms) / 1000.0

    def _claim(self, record: Record) -> Task | None:
        return self.diagnosis.claim(record.slot, (record.prompt_n or 0) + (record.cache_n or 0))

    def _complete(self, scenario: str, step: str, role: Role, request: Request,
                  expect_hit: bool, may_stop: bool = False) -> tuple[Completion, str] | None:
        """One completion, recorded; None for a step stopped once its count was known (only measured steps
        that may stop)."""
        key = lora_key(request.lora)
        record = self.recorder.open(scenario, step, role, request.endpoint, tokens=request.tokens, lora=request.lora,
                                    ideal=self._ideal(request.tokens, key), slot=self.last_slot)
        # where the prompt first differs from what the slot last used holds (a position, never tokens)
        record.extra["diverges_at"] = common_prefix(request.tokens, self._slot_sequence[1])
        if self._restored:
            record.extra["slot_from"], self._restored = "disk", False
        record.expected_hit = expect_hit
        expected = self.expectation.complete(request.tokens, lora=request.lora, user_starts=request.user_starts,
                                             images=request.images)
        if request.images:
            record.extra.update(Extra(images_sent=len(request.images),
                                      image_spans=[[start, length] for start, length in request.images]))
        not_modelled = self.spec.memory.not_modelled or expected.not_modelled
        if not_modelled:  # no prediction rather than a wrong one: the counts are still measured
            record.extra["not_modelled"] = not_modelled
        else:
            record.expected, record.cause_expected = expected.prompt_n, expected.cause
            if expected.wrong_output:
                record.extra["expected_wrong_output"] = True
        record.host = self.server.host_state()
        sampler = self.server.sampler
        gpu_mark = sampler.mark()
        timeout = self._deadline(len(request.tokens))
        shown = self.progress.callback(scenario, step, role)
        try:
            completion, reply = request.send(True, self._stopper(record, shown) if may_stop else shown, timeout)
        except StreamEnded as ended:
            record.gpu = sampler.summary_dict(gpu_mark, sampler.mark())
            self.progress.clear()
            self._stopped(record, request, ended)
            return None
        except (ClientError, KeyboardInterrupt) as exc:
            self.progress.clear()
            self._attach(record, self.diagnosis.claim(None, len(request.tokens), wait_s=0.0, released=False))
            record.gpu = sampler.summary_dict(gpu_mark, sampler.mark())
            record.extra["timeout_s"] = round(timeout, 1)
            if isinstance(exc, KeyboardInterrupt):  # keep what the step got to, then stop
                self.recorder.cut_short(record, interrupted())
                raise
            raise self.diagnosis.fail(record, exc) from exc
        record.gpu = sampler.summary_dict(gpu_mark, sampler.mark())
        self.progress.clear()
        self._answered(record, completion)
        if record.slot is None:  # chat responses do not name the slot; the log does
            record.slot = (record.cause or {}).get("slot")
        self.last_slot = record.slot if record.slot is not None else self.last_slot
        self._slot_sequence = (key, request.tokens + completion.tokens)
        self.expectation.answered(completion.tokens)
        self._seen.setdefault(key, PerfectCache()).add(self._slot_sequence[1])
        try:
            if completion.cache_n == 0:  # computed without reuse: a reference itself, for earlier steps too
                self.references.use(record, completion)
            if role == Role.MEASURE:
                self._judge(record, completion, request)
        finally:  # a failed reference call must not lose the measurement
            self.recorder.write(record)
            self.measured.append(record)
        self.progress.step(record)
        return completion, reply

    def _stopper(self, record: Record, shown: ProgressCallback | None) -> ProgressCallback:
        """The progress callback that ends the stream at the first event when nothing needs the step's output."""
        first = [True]

        def on_progress(processed: int, cached: int, total: int) -> bool:
            if shown:
                shown(processed, cached, total)
            decide, first[0] = first[0], False
            return decide and stops_at(total - cached, cached, verify=self.references.verify,
                                       awaited=self.references.awaited(record))

        return on_progress

    def _stopped(self, record: Record, request: Request, ended: StreamEnded) -> None:
        """A step ended at its count: erase what the cancelled task left in the slot, record the count."""
        record.prompt_n, record.cache_n = ended.total - ended.cached, ended.cached
        record.excess = None if record.ideal is None else record.prompt_n - record.ideal
        record.extra["prefill_seconds"] = STOPPED
        record.ended_at = time.time()
        record.wall_ms = (record.ended_at - record.started_at) * 1000.0
        waited = time.time()
        # With one slot the erase goes out at once (the cancelled task prefills until it lands) and its task is
        # matched after it. With more, the log must first name the slot: the server writes its log from another
        # thread, so at the first progress event the task's lines may not be in the file yet.
        task = None if self.spec.n_slots == 1 else self._claim_stopped(ended)
        waited = time.time() - waited  # the harness's, not the server's
        slot = None if task is None else task.slot  # the stream named none: the log's selection line does
        record.slot = self.last_slot = slot = self.last_slot if slot is None else slot
        try:
            erased = self._call(record.scenario, "erase slot", f"/slots/{slot}?action=erase",
                                lambda: self.server.client.slot_erase(slot))
            # the slot held the reused prefix and what was prefilled before the cancel took effect
            record.prefilled_n = max(0, int(erased.get("n_erased", ended.cached)) - ended.cached)
            self._attach(record, task or self._claim_stopped(ended))
        finally:
            # the server worked until the erase, less the wait for its log line: not harness time
            self.server_s += time.time() - record.started_at - waited
            key = lora_key(request.lora)
            self.expectation.erase(slot)
            self._slot_sequence = (key, [])
            self._seen.setdefault(key, PerfectCache()).add(request.tokens)  # the prompt was seen; its answer is not
            self._outcome(record)
            self.recorder.write(record)
            self.measured.append(record)
        self.progress.step(record)

    def _claim_stopped(self, ended: StreamEnded) -> Task | None:
        """A stopped step's task, as soon as the log shows it (it is released only by the erase)."""
        return self.diagnosis.claim(None, ended.total, wait_s=SLOT_LINE_WAIT_S, released=False)

    @staticmethod
    def _attach(record: Record, task: Task | None) -> None:
        if task is not None:
            Recorder.attach_task(record, task)

    def _outcome(self, record: Record) -> None:
        # More reused than the longest prefix ever computed under this LoRA: state computed for something else
        # (another LoRA, or a chunk shifted out of its context), whatever the output says.
        foreign = (record.cache_n or 0) - ((record.prompt_tokens or 0) - (record.ideal or 0))
        if foreign > 0:
            record.extra["foreign_reused"] = foreign
        record.verdict = verdict(record)

    def _judge(self, record: Record, c: Completion, request: Request) -> None:
        """Speedup, correctness against a no-reuse reference (now or deferred), and the step's outcome (hit, partial,
        miss or WRONG OUTPUT; the record keeps it in its ``verdict`` field)."""
        if record.scenario == "first_load":
            self._first_load_ms = c.prompt_ms
            if c.prompt_ms > 0 and c.prompt_n > 0:
                self._rate = c.prompt_n / (c.prompt_ms / 1000.0)
        if self._first_load_ms and c.prompt_ms > 0:
            record.speedup = self._first_load_ms / c.prompt_ms
        self._outcome(record)
        self.references.judge(record, c, request)
