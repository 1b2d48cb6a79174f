"""What a session says on the terminal: one line per scenario and step, and a live prefill line on a tty."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from typing import TextIO

from reusebench.llama.client import ProgressCallback
from reusebench.records import Record, Role
from reusebench.run.plan import Estimate

# Fault injection and progress watching: (scenario, step, role, processed, cached, total) on every prompt-progress
# event. Tests pass one that kills or stops the real server when a prefill passes some fraction.
ProgressHook = Callable[[str, str, str, int, int, int], None]


class Progress:
    """One session's terminal output, prefixed with its name."""

    def __init__(self, name: str, out: TextIO, hook: ProgressHook | None = None,
                 estimate: Estimate | None = None) -> None:
        self.name, self.out, self.hook, self.estimate = name, out, hook, estimate

    def say(self, text: str) -> None:
        print(f"[{self.name}] {text}", file=self.out, flush=True)

    def callback(self, scenario: str, step: str, role: str) -> ProgressCallback | None:
        """The client's progress callback for one call: the hook, and a live line on a tty (None: neither)."""
        tty, hook = self.out.isatty(), self.hook
        if not tty and hook is None:
            return None

        def show(processed: int, cached: int, total: int) -> None:
            if hook is not None:
                hook(scenario, step, role, processed, cached, total)
            if tty:
                pct = 100.0 * processed / total if total else 100.0
                label = step if role != Role.REFERENCE else f"{step} (reference)"
                self.out.write(f"\r  {label}: prefill {pct:5.1f}% ({processed:,}/{total:,} tokens, {cached:,} cached)")
                self.out.flush()

        return show

    def clear(self) -> None:
        if self.out.isatty():
            self.out.write("\r\033[K")

    def step(self, r: Record) -> None:
        label = "setup prefill" if r.role == Role.SETUP else (r.verdict or "")
        if r.extra.get("expected_wrong_output"):  # the reuse model knows the reused state to be foreign
            label += "; wrong output predicted"
        seconds = "stopped at its count" if r.prompt_ms is None else f"in {r.prompt_ms / 1000:.2f} s"
        self.say(
            f"  {r.scenario}/{r.step}: re-processed {r.prompt_n:,} of {r.prompt_tokens:,} "
            f"(ideal {r.ideal:,}, expected {_count(r.expected)}) {seconds}  [{label}]  "
            f"{r.cause['summary'] if r.cause else ''}"
        )
        self.done(r)

    def done(self, r: Record) -> None:
        """A call of the session ended: the run's estimate of time left moves on."""
        if self.estimate is not None:
            self.estimate.done(self.name, r)


def _count(n: int | None) -> str:
    return "not modelled" if n is None else f"{n:,}"


class Lines(io.StringIO):
    """A text stream that hands each complete line to `say`; on flush, a partial line to `partial` (where given).
    Runs print their progress to a stream; this is how a caller takes it line by line."""

    def __init__(self, say: Callable[[str], None], partial: Callable[[str], None] | None = None,
                 tty: bool = False) -> None:
        super().__init__()
        self.say, self.partial, self.tty, self.pending = say, partial, tty, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.say(line)
        return len(text)

    def flush(self) -> None:
        if self.partial is not None:
            self.partial(self.pending)
            self.pending = ""

    def isatty(self) -> bool:
        return self.tty


def fit(text: str, width: int) -> str:
    """Each line of `text` wrapped to `width` columns, its continuation indented under it; a word longer than the
    width (a path) stays whole, and a live line (``\\r``) keeps its control characters."""
    fitted_lines = []
    for line in text.split("\n"):
        live, mark, body = line.rpartition("\r")
        if mark and body.startswith("\033[K"):
            mark, body = mark + "\033[K", body.removeprefix("\033[K")
        indent = " " * (len(body) - len(body.lstrip(" ")))
        fitted_lines.append(live + mark + (textwrap.fill(body, width, subsequent_indent=indent + "    ",
                                                         break_long_words=False, break_on_hyphens=False)
                                           if len(body) > width and body.strip() else body))
    return "\n".join(fitted_lines)


def fitted(to: TextIO, width: int) -> Lines:
    """`to`, with each line fitted to `width` columns (``fit``) as it is written."""

    def say(line: str) -> None:
        to.write(fit(line, width) + "\n")

    def partial(text: str) -> None:
        to.write(text)
        to.flush()

    return Lines(say, partial, tty=to.isatty())
