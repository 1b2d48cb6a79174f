"""Server defects the fuzzer found and named: a case that meets one ends at it, counted as the defect, not as a
difference of the reuse model. Each is listed in docs/llama-server-reuse.md ("Defects the fuzzer found") and kept
as a case in tests/data/fuzz/, whose test fails once a build no longer shows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reusebench.fuzz.case import Case

# An abort's own line: a source file and line, and the failed assertion (llama.cpp's words, no prompt text)
_ABORT = re.compile(r"([\w.-]+\.(?:cpp|c|h)):(\d+): (GGML_ASSERT\(.*\) failed|GGML_ABORT.*|.*error.*)$")


@dataclass(frozen=True)
class Defect:
    name: str
    words: str  # what the server's log says as it dies
    applies: Callable[[Case], bool]  # the cases it can show in


KNOWN = (
    Defect("cache-reuse shift on a cache of no layers", "ggml-backend.cpp:345: GGML_ASSERT(buffer) failed",
           lambda case: case.family == "windowed-hybrid" and "cache-reuse" in case.options),
)


def abort_line(log: Path) -> str:
    """The server's last abort line (``file.cpp:N: GGML_ASSERT(...) failed``), the file without its directory;
    "" where the log has none."""
    found = ""
    try:
        with open(log, errors="replace") as lines:
            for line in lines:
                match = _ABORT.search(line.strip())
                if match:
                    found = f"{match.group(1)}:{match.group(2)}: {match.group(3)}"
    except OSError:
        return ""
    return found


def named(case: Case, died: str) -> Defect | None:
    """The known defect a server's death in `case` is, from its abort line `died`."""
    return next((d for d in KNOWN if d.words in died and d.applies(case)), None)
