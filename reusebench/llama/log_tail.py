"""Reading a log that a server is still writing: what it gained since an offset, in whole lines (``LogTail``)."""

from __future__ import annotations

from pathlib import Path

_TAIL_BLOCK = 64 * 1024


class LogTail:
    """Reads what a log file gained since an offset, in whole lines.

    ``offset()`` points just after the last complete line, so a line still being written when the offset is taken
    is read in full by the next ``read_since``; a partial last line at read time is left for the next read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def offset(self) -> int:
        try:
            with self.path.open("rb") as f:
                end = f.seek(0, 2)
                # scan back block by block for the last newline; logs can be large, lines are short
                pos = end
                while pos > 0:
                    step = min(_TAIL_BLOCK, pos)
                    f.seek(pos - step)
                    block = f.read(step)
                    newline = block.rfind(b"\n")
                    if newline >= 0:
                        return pos - step + newline + 1
                    pos -= step
                return 0
        except FileNotFoundError:
            return 0

    def read_since(self, offset: int) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        return complete.decode("utf-8", errors="replace").splitlines()
