"""Per-request causes when requests run concurrently: the server log cut into tasks.

``causes.explain`` reads the events logged while one request ran, which is right
when requests come one at a time. Under load, several tasks decode at once and
their lines interleave. What keeps them apart: the server launches one task at a
time on its main loop, so a launch is one contiguous block of lines (slot
selection, the RAM cache lookup, a LoRA clear, ``processing task``, then the idle
slots it saves to RAM), and every later line of that task carries its slot and
task id. A sleep logged before a launch belongs to it (the request woke the server).

The block's RAM saves before ``processing task`` are the selected slot's old
contents (displaced by this request); those after it are idle slots moved to RAM.
A request is matched to its task by slot and prompt length (the ``new prompt``
line), first unclaimed first: one slot serves one request at a time. A request whose answer names no slot (the
OpenAI-style endpoints) is matched by prompt length alone.

The log may outlive one server: a restarted server appends to it (``>>``) or starts it anew (``>``, the file
shrinks). Task ids start again at 0 in each lifetime, so tasks are told apart by lifetime too; a new lifetime
begins where a server logs that it listens (a wake from sleep reloads the model but keeps counting tasks), and
whatever block the old one left unfinished ends there.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from reusebench.llama import causes, logs
from reusebench.llama.logs import Event

SELECTION_KINDS = frozenset({"slot_skipped_empty", "slot_similarity_checked", "slot_selected_by_id",
                             "slot_selected_by_lcp", "slot_selected_by_lru"})
SLEEP_KINDS = frozenset({"sleep_entering", "sleep_exiting"})
LIFETIME_KIND = "server_listening"  # a server process starts (a wake reloads the model, not the task ids)
POLL_S = 0.05


@dataclass
class Task:
    """One launched task: the events that explain it and what its launch moved to RAM."""

    slot: int | None = None
    task: int | None = None
    lifetime: int = 0  # which server start of the log it ran in, from 0
    events: list[Event] = field(default_factory=list)
    displaced: list[int] = field(default_factory=list)  # tokens of the selected slot's old contents saved to RAM
    idle_saved: list[int] = field(default_factory=list)  # tokens of idle slots saved to RAM by this launch
    evicted_mib: list[float] = field(default_factory=list)  # RAM entries dropped during this launch
    n_tokens: int | None = None  # the prompt length (``new prompt``)
    claimed: bool = False
    launched_at: int = -1  # the positions (among parsed events) of ``processing task`` and ``stop processing``
    released_at: int | None = None

    def cause(self) -> causes.Cause:
        return causes.explain(self.events)


MAX_TASKS = 2_000  # tasks held: the oldest go first (a tap runs for months)
# claimed tasks that keep their events: each claimer reads them (the cause) right after its claim; an older one
# keeps only its positions (launch, release) for running_at_launch. At -lv 4 a launch logs every RAM-cache entry,
# so a task's events can weigh tens of KB.
KEEP_CLAIMED = 256
# the RAM cache's listing, printed at every launch (one line per entry): it describes the cache, not the task, and
# no cause reads it; not even parsed into events (most of a busy log)
LISTING_KINDS = frozenset({"ram_cache_state", "ram_cache_entry", "ram_candidate"})
READ_CHUNK = 1 << 20


class TaskLog:
    """Reads a growing server log and hands each finished request the task that served it. Holds at most
    `max_tasks` tasks, dropping the oldest (counted in ``dropped``), and the events of the last ``KEEP_CLAIMED``
    claimed ones only."""

    def __init__(self, path: Path, max_tasks: int = MAX_TASKS) -> None:
        self.path = Path(path)
        self.max_tasks = max_tasks
        self.dropped = 0
        self._offset = 0
        self._lock = threading.Lock()
        self._tasks: dict[tuple[int, int], Task] = {}  # (slot, task id) of the current lifetime
        self._by_slot: dict[int, list[Task]] = {}
        self._held: collections.deque[Task] = collections.deque()  # every task held, in launch order, any lifetime
        self._claimed: collections.deque[Task] = collections.deque()  # claimed tasks that still hold their events
        self._launching: Task | None = None  # the block being read, until the next selection starts another
        self._asleep_events: list[Event] = []
        self._events = 0  # events parsed so far: a task's launch and release by position in the log
        self.lifetimes = 0  # server starts seen in the log
        self._sleeps = 0
        self._asleep = False
        self.read_error = ""  # the class of the last error that stopped a read (PermissionError, ...)
        self._kinds: set[str] = set()  # of the lines read: llama-server's fixed vocabulary, a few dozen at most

    def claim(self, slot: int | None, n_tokens: int, wait_s: float = 2.0, *, released: bool = True) -> Task | None:
        """The first unclaimed task on `slot` (any slot: None) whose prompt had `n_tokens` tokens, with its lines
        up to its release, waiting up to `wait_s` for them to reach the log (the server logs the release, and the
        prompt's timing, as the answer ends, so a reader may come first); None when the task never shows (the
        request's record then has no cause). A task whose release does not come in time is returned as read; with
        `released` False, as soon as it shows (a request cut short, whose task is still running)."""
        deadline = time.monotonic() + wait_s
        found: Task | None = None
        while True:
            with self._lock:
                self._read()
                if found is None:
                    candidates = self._by_slot.get(slot, []) if slot is not None else sorted(
                        (t for tasks in self._by_slot.values() for t in tasks), key=lambda t: t.launched_at)
                    found = next((t for t in candidates if not t.claimed and t.n_tokens == n_tokens), None)
                    if found is not None:
                        found.claimed = True
                        self._claimed.append(found)
                        if len(self._claimed) > KEEP_CLAIMED:
                            self._claimed.popleft().events = []  # its claimer read them long ago
                if found is not None and (found.released_at is not None or not released):
                    return found
            if time.monotonic() > deadline:
                return found
            time.sleep(POLL_S)

    def running_at_launch(self, task: Task) -> list[int]:
        """The tasks that had been launched and not yet released when `task` was launched (read so far)."""
        with self._lock:
            self._read()
            return sorted(other.task for other in self._tasks.values() if other is not task and other.task is not None
                          and other.launched_at < task.launched_at
                          and (other.released_at is None or other.released_at > task.launched_at))

    def sleeps(self) -> int:
        """How often the server went to sleep, in the log read so far (read up to now)."""
        with self._lock:
            self._read()
            return self._sleeps

    def kinds(self) -> frozenset[str]:
        """The kinds of line in the log read so far (read up to now): whether it has what the causes need."""
        with self._lock:
            self._read()
            return frozenset(self._kinds)

    def _read(self) -> None:
        """Parse what the log gained since the last read, `READ_CHUNK` bytes at a time: at -lv 4 every launch lists
        the whole RAM cache, so a busy server's log grows fast, and a read must not hold all of it."""
        try:
            with self.path.open("rb") as f:
                if f.seek(0, 2) < self._offset:
                    self._offset = 0  # started anew by a restarted server
                while True:
                    f.seek(self._offset)
                    data = f.read(READ_CHUNK)
                    complete = data[: data.rfind(b"\n") + 1]
                    if not complete:  # nothing new, or a partial line (or one longer than a chunk: skipped)
                        self._offset += len(data) if len(data) == READ_CHUNK else 0
                        if len(data) < READ_CHUNK:
                            return
                        continue
                    self._offset += len(complete)
                    lines = complete.decode("utf-8", errors="replace").splitlines()
                    for event in logs.parse_lines(lines, skip=LISTING_KINDS):
                        self._add(event)
        except FileNotFoundError:
            return
        except OSError as exc:  # a log this process may not read: requests get no cause, and a summary says why
            self.read_error = type(exc).__name__

    def _drop_oldest(self) -> None:
        task = self._held.popleft()
        assert task.slot is not None
        on_slot = self._by_slot[task.slot]
        del on_slot[next(i for i, t in enumerate(on_slot) if t is task)]  # by identity: Tasks compare by value
        if self._tasks.get((task.slot, task.task)) is task:  # type: ignore[arg-type]
            del self._tasks[(task.slot, task.task)]  # type: ignore[arg-type]
        self.dropped += 1

    def _add(self, e: Event) -> None:
        self._events += 1
        self._kinds.add(e.kind)
        if e.kind == LIFETIME_KIND:
            self.lifetimes += 1
            self._tasks, self._launching, self._asleep_events = {}, None, []
            return
        block = self._launching
        if e.kind in SLEEP_KINDS:  # the queue and the server each log the change: count the change once
            entering = e.kind == "sleep_entering"
            self._sleeps += entering and not self._asleep
            self._asleep = entering
            self._asleep_events.append(e)
        elif e.kind in SELECTION_KINDS and (block is None or block.task is not None):
            block = self._launching = Task(events=self._asleep_events)
            self._asleep_events = []
            self._selection(block, e)
        elif (e.kind == "processing_task" and block is not None and block.task is None and e.slot is not None
              and e.task is not None):
            block.slot, block.task, block.launched_at = e.slot, e.task, self._events
            block.lifetime = max(0, self.lifetimes - 1)
            block.events.append(e)
            self._tasks[(e.slot, e.task)] = block
            self._by_slot.setdefault(e.slot, []).append(block)
            self._held.append(block)
            if len(self._held) > self.max_tasks:
                self._drop_oldest()
        elif e.slot is not None and e.task is not None and e.task >= 0:
            task = self._tasks.get((e.slot, e.task))
            if task is not None:
                task.events.append(e)
                if e.kind == "new_prompt":
                    task.n_tokens = int(e.fields["n_tokens"])
                elif e.kind == "stop_processing":
                    task.released_at = self._events
        elif block is not None:
            self._launch_line(block, e)

    @staticmethod
    def _selection(block: Task, e: Event) -> None:
        if e.kind.startswith("slot_selected"):
            block.slot = e.slot
            block.events.append(e)

    def _launch_line(self, block: Task, e: Event) -> None:
        """A line of the launch block with no task id: the selection, RAM cache work, a LoRA clear."""
        if e.kind in SELECTION_KINDS and block.task is None:
            self._selection(block, e)
            return
        if e.slot is not None and e.slot != block.slot:
            return  # an idle slot's own lines (saved, cleared): its tokens come with the srv save line
        if e.kind == "ram_prompt_saved":
            (block.displaced if block.task is None else block.idle_saved).append(int(e.fields["n_tokens"]))
        elif e.kind in causes.RAM_EVICTION_KINDS:
            block.evicted_mib.append(float(e.fields["size_mib"]))
        if block.task is None or e.kind != "ram_prompt_saved":
            block.events.append(e)
