"""The progress line of trnc.compile: one status line on a terminal, redrawn at each step, nothing elsewhere.

trnc.compile (trnc/api.py) announces its steps (capture, the cache, each pass of passes/pipeline.py,
the performance model) as they start and end; on a terminal the line reads
`trnc compile [5/15] fuse ...` while a step runs and `trnc compile [5/15] fuse 0.31s` when it ends,
and it is erased when the compile returns or fails, so the terminal keeps only what the user asked
for. When the stream is not a terminal (a pipe, a file, a notebook, CI) nothing is written: a log
file must not fill with carriage returns. The stream is a parameter so tests can pass a fake terminal.
"""
from __future__ import annotations

import sys
import time

_ERASE = "\r\x1b[K"      # carriage return, then erase to the end of the line (ANSI EL)


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or a closed stream
        return False


class Progress:
    """Steps of one long operation on one redrawn line; use as a context manager so the line is always erased.

    `total` is the number of steps expected; it may be lowered once the path is known (a cache hit).
    """

    def __init__(self, total: int, *, label: str = "trnc compile", stream=None, enabled: bool = True):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled and is_terminal(self.stream)
        self.total = total
        self.label = label
        self.index = 0
        self.step = ""
        self._step_start = 0.0
        self._drawn = False

    def begin(self, step: str) -> None:
        """Step `step` starts."""
        self.index += 1
        self.step = step
        self._step_start = time.perf_counter()
        self._draw(f"{step} ...")

    def status(self, text: str) -> None:
        """Redraw the current step's line as `text` (what the step is doing now)."""
        self._draw(text)

    def end(self, seconds: float | None = None) -> float:
        """The current step ended after `seconds` (measured here when None); returns the seconds."""
        if seconds is None:
            seconds = time.perf_counter() - self._step_start
        self._draw(f"{self.step} {seconds:.2f}s")
        return seconds

    def close(self) -> None:
        """Erase the line: the compile's result, or its error, starts on a clean line."""
        if self._drawn:
            self.stream.write(_ERASE)
            self.stream.flush()
            self._drawn = False

    def _draw(self, text: str) -> None:
        if not self.enabled:
            return
        self.stream.write(f"{_ERASE}{self.label} [{self.index}/{max(self.total, self.index)}] {text}")
        self.stream.flush()
        self._drawn = True

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
