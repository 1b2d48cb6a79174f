"""A workload's users against one llama-server: the schedule that orders their requests, and the two ways to run it.

- ``serial`` (the default, ``SerialRun``): the schedule in ``schedule`` sends one request at a time, so every
  run of one build gives the same slots, RAM contents, evictions and so the same counts; a deviation seen in the
  server's log fails the run.
- ``free-running`` (``FreeRunningRun``): one thread per user, think times on the wall clock, the health check on
  its period: the server under the real scramble of threads, whose counts vary from run to run.

What both share (the server, the recorder, one call and its record, the users' texts) lives in ``base``,
``calls`` and ``texts``.
"""

from __future__ import annotations

import sys
from typing import TextIO

from reusebench.config.workload import FREE_RUNNING, Workload
from reusebench.records import RecordWriter
from reusebench.run.launch import LaunchSpec
from reusebench.run.recording import RunDir
from reusebench.run.service.base import ServiceRun, Via, WorkloadResult, resolve_for_workload
from reusebench.run.service.free_running import FreeRunningRun
from reusebench.run.service.serial import ScheduleDeviation, SerialRun

__all__ = ["FreeRunningRun", "WorkloadResult", "ScheduleDeviation", "SerialRun", "ServiceRun", "Via", "resolve_for_workload", "service_run"]


def service_run(workload: Workload, spec: LaunchSpec, writer: RecordWriter, *, run: RunDir,
                free_running: bool = False, repeat: int | None = None, via: Via | None = None,
                out: TextIO = sys.stderr) -> ServiceRun:
    """The workload's run on `spec` (``resolve_for_workload``): free-running when asked or when the workload's
    schedule says so, else serial. `repeat` numbers the run among repeated ones (its records carry it); `via` puts
    a relay between the users and the server."""
    kind = FreeRunningRun if free_running or workload.schedule == FREE_RUNNING else SerialRun
    return kind(workload, spec, writer, run=run, repeat=repeat, via=via, out=out)
