"""One case played on a real llama-server and on the reuse model side by side: every request's expected count
beside the measured one, and the slot each chose.

The model is fed each request before the server's answer is looked at (``reuse.expectation``), as a replay does;
the answer is forced (one token outside the blocks, ``trace.prompts``), so what a slot holds afterwards is known
to both. A step that differs carries what the server's log says of it (``llama.causes``: numbers and reasons,
never text).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from reusebench import tiny
from reusebench.capability.build import Build
from reusebench.config.profiles import Variant
from reusebench.fuzz import defects
from reusebench.fuzz.case import Case, Send, SlotAction
from reusebench.llama import binaries, task_log
from reusebench.llama.causes import Cause
from reusebench.llama.client import ClientError, Completion, LlamaClient
from reusebench.llama.outputs import difference
from reusebench.llama.server import Server
from reusebench.reuse.expectation import ServerModel
from reusebench.reuse.segments import Segments
from reusebench.reuse.server_state import Held
from reusebench.reuse.verification import WRONG, judge
from reusebench.run import launch, settings
from reusebench.run.service.calls import FORCED_BIAS
from reusebench.trace.prompts import BlockIds, vocabulary

CALL_TIMEOUT_S = 120.0
THREADS = 2
N_PROBS = 5  # each answer position's top probabilities: what a reused output is compared by
NO_ANSWER = "no answer"  # the connection ended without a status: the server may have died
DEATH_WAIT_S = 60.0  # a request failed without an answer: how long the server may take to die of it


# What the server's log says a request went through (``llama.causes.Cause``): how much of the fuzz reached each path
PATHS: tuple[tuple[str, Callable[[Cause], bool]], ...] = (
    ("RAM restore", lambda c: c.ram_restored),
    ("RAM eviction", lambda c: bool(c.ram_evicted_mib)),
    ("RAM state too large", lambda c: c.ram_skipped_too_large),
    ("checkpoint restore", lambda c: c.checkpoint_n_tokens is not None),
    ("full re-processing", lambda c: c.forced_full),
    ("cache-reuse shift", lambda c: bool(c.cache_reuse_chunks)),
    ("checkpoint created", lambda c: bool(c.checkpoints_created)),
)


class CaseError(ValueError):
    """A case this build cannot run (an option it lacks); the message names it."""


@dataclass(frozen=True)
class Step:
    """One request as both sides saw it."""

    number: int  # from 1, among the case's steps
    expected: int
    measured: int
    expected_slot: int
    measured_slot: int | None
    expected_cause: str
    wrong_expected: bool  # the model knows the reused state to be foreign or stale: a wrong output is no surprise
    measured_cause: str = ""
    error: str = ""  # the server refused the request (its status only: an error message is text), or died
    paths: tuple[str, ...] = ()  # the server's reuse paths it took, from its log (``PATHS``)
    defect: str = ""  # the known server defect it met (``fuzz.defects``): not the model's difference
    output: str = ""  # the reused output against no reuse (``reuse.verification``); "" where not compared
    output_delta: float = 0.0

    @property
    def wrong_output(self) -> bool:
        """A reused output beyond the noise that the model did not expect: a finding about llama.cpp."""
        return self.output == WRONG and not self.wrong_expected

    @property
    def differs(self) -> bool:
        if self.defect:
            return False
        return (bool(self.error) or self.expected != self.measured or self.expected_slot != self.measured_slot
                or self.wrong_output)

    def describe(self) -> str:
        if self.wrong_output:
            return (f"step {self.number}: the reused output is WRONG: {self.output_delta:.3g} of the top "
                    f"probability from no reuse ({self.measured_cause or self.expected_cause})")
        if self.defect:
            return f"step {self.number}: a known server defect, {self.defect} ({self.error})"
        if self.error:
            return f"step {self.number}: the server refused it ({self.error})"
        slot = "" if self.expected_slot == self.measured_slot else (
            f"; slot {self.measured_slot}, expected {self.expected_slot}")
        return (f"step {self.number}: expected {self.expected:,} ({self.expected_cause}), measured "
                f"{self.measured:,} ({self.measured_cause or 'the log says nothing'}){slot}")


@dataclass
class Outcome:
    case: Case
    steps: list[Step] = field(default_factory=list)

    @property
    def difference(self) -> Step | None:
        return next((s for s in self.steps if s.differs), None)

    @property
    def defect(self) -> str:
        return next((s.defect for s in self.steps if s.defect), "")


def variant_of(case: Case, binary: binaries.Binary, model_file: Path | None = None) -> Variant:
    """The case's launch as a profile variant of its tiny model (or `model_file`, a GGUF of the same family), on
    `binary`."""
    return Variant(profile="fuzz", name=case.family, binary=binary, model=model_file or tiny.model_path(case.model),
                   model_spec=str(model_file) if model_file else f"tiny:{case.model}", mmproj=None, lora=(),
                   options={"threads": THREADS, **case.options}, sizes=(), scenarios=(), verify=False, n_predict=1)


def check_options(case: Case, build: Build) -> None:
    for name, value in case.options.items():
        problem = binaries.option_problem(build.help, name, value)
        if problem is not None:
            raise CaseError(f"--{name}: {problem} ({build.path})")


def reference_args(case: Case, variant: Variant) -> list[str]:
    """The no-reuse reference: one slot, no RAM cache, no checkpoints, the case's batch sizes and context."""
    args = ["-m", str(variant.model), "-np", "1", "--cache-ram", "0", "--ctx-checkpoints", "0",
            "--threads", str(THREADS), "--ctx-size", str(case.options["ctx-size"])]
    for name in ("batch-size", "ubatch-size"):
        if name in case.options:
            args += [f"--{name}", str(case.options[name])]
    return args


def play(case: Case, build: Build, *, outputs: bool = False, model_file: Path | None = None) -> Outcome:
    """Every step of `case` on a fresh server of `build` and on a fresh model of it; stops at the first step
    that differs (what follows it depends on it). `outputs`: every request that reused something is computed
    again without reuse on a second server, and the two outputs compared (``reuse.verification``; a tiny
    model's noise floor, so not for `model_file`, a GGUF in place of the tiny one: its counts only)."""
    check_options(case, build)
    variant = variant_of(case, build.binary, model_file)
    spec = launch.resolve(variant, build, context=None, verify=False, early_stop=False)
    model = spec.reuse_model()
    blocks = BlockIds(vocabulary(variant.model), case.block_tokens)
    outcome = Outcome(case)
    with tempfile.TemporaryDirectory(prefix="reusebench-fuzz-") as slots_dir, ExitStack() as servers:
        extra = ["--slot-save-path", slots_dir] if case.saves_slots else []
        server = servers.enter_context(spec.server(call_timeout_s=CALL_TIMEOUT_S, extra_args=extra))
        reference = servers.enter_context(Server.of(build.path, reference_args(case, variant),
                                                    call_timeout_s=CALL_TIMEOUT_S)) if outputs else None
        tasks = task_log.TaskLog(server.process.raw_log_path)
        files: dict[int, Held] = {}
        for number, step in enumerate(case.steps, 1):
            if isinstance(step, SlotAction):
                _slot_action(server.client, model, step, files)
                continue
            ids = blocks.tokens(Segments(step.runs, blocks))  # what both servers are sent
            played, completion = _send(server.client, tasks, model, blocks, step, number, ids)
            if played.error == NO_ANSWER and _dies(server):
                played = _died(case, played, server)
            if reference is not None and completion is not None and completion.cache_n > 0:
                played = _judged(played, completion, reference.client, blocks, step, ids)
            outcome.steps.append(played)
            if played.differs or played.defect:
                break
    return outcome


def _judged(step: Step, reused: Completion, reference: LlamaClient, blocks: BlockIds, sent: Send,
            ids: list[int]) -> Step:
    """The reused output against the same prompt computed without reuse, both answers forced to the same tokens,
    so every position's distribution is compared (``llama.outputs.difference``; the tiny models' noise floor)."""
    again = reference.complete(ids, n_predict=sent.n_predict, n_probs=N_PROBS,
                               cache_prompt=False, timeout_s=CALL_TIMEOUT_S, extra=_forced(blocks))
    found = difference(reused, again)
    return replace(step, output=judge(found, 0.0) or WRONG, output_delta=found.delta)


def _forced(blocks: BlockIds) -> dict[str, object]:
    return {"ignore_eos": True, "logit_bias": [[blocks.vocabulary.answer, FORCED_BIAS]]}


def _dies(server: Server) -> bool:
    """Whether a server that failed a request is dying: an abort first prints a backtrace (llama.cpp runs gdb for
    it), which takes seconds on a busy machine."""
    deadline = time.monotonic() + DEATH_WAIT_S
    while server.process.is_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not server.process.is_running()


def _died(case: Case, step: Step, server: Server) -> Step:
    """A request the server died on: its abort line, and the known defect that is, if one."""
    died = defects.abort_line(server.process.raw_log_path) or f"exit status {server.process.returncode()}"
    defect = defects.named(case, died)
    return replace(step, error=f"the server died: {died}", defect=defect.name if defect else "")


def _slot_action(client: LlamaClient, model: ServerModel, step: SlotAction, files: dict[int, Held]) -> None:
    name = f"case-{step.file}.bin"
    if step.action == "save":
        files[step.file] = model.saved(step.slot)
        client.slot_save(step.slot, name)
    elif step.action == "restore":
        model.restore(step.slot, files[step.file])
        client.slot_restore(step.slot, name)
    else:
        model.erase(step.slot)
        client.slot_erase(step.slot)


def _send(client: LlamaClient, tasks: task_log.TaskLog, model: ServerModel, blocks: BlockIds, step: Send,
          number: int, ids: list[int]) -> tuple[Step, Completion | None]:
    prompt = Segments(step.runs, blocks)
    expected = model.complete(prompt)
    expected_slot = model.last_slot
    answer = blocks.vocabulary.answer
    try:
        completion = client.complete(ids, n_predict=step.n_predict, n_probs=N_PROBS,
                                     timeout_s=CALL_TIMEOUT_S, extra=_forced(blocks))
    except ClientError as exc:
        return Step(number, expected.prompt_n, -1, expected_slot, None, expected.cause, wrong_expected=False,
                    error=f"HTTP {exc.status}" if exc.status else NO_ANSWER), None
    model.answered(blocks.answer(step.n_predict))
    task = tasks.claim(completion.id_slot, len(prompt), wait_s=settings.DEFAULT.claim_wait_s(alone=True))
    logged = task.cause() if task is not None else None
    cause = logged.summary if logged is not None else ""
    paths = tuple(name for name, took in PATHS if logged is not None and took(logged))
    if any(t != answer for t in completion.tokens):  # the slot holds another answer than the model was told
        cause = f"{cause}; the answer was not the forced token"
        return Step(number, expected.prompt_n, completion.prompt_n, expected_slot, completion.id_slot,
                    expected.cause, expected.wrong_output, cause, error="answer not forced"), completion
    return Step(number, expected.prompt_n, completion.prompt_n, expected_slot, completion.id_slot, expected.cause,
                expected.wrong_output, cause, paths=paths), completion
