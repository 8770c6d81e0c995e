"""Progress for long work (planning, profiling), drawn by ``tqdm`` (the bar users already know)
on stderr.

Data goes to stdout and progress to stderr, so a bar would only garble a pipe or a log: it is
drawn when its stream is a terminal (or when forced) and nothing is written otherwise.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TextIO

from tqdm import tqdm


def _columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to; 0 when it reports none, -1 when it is
    no terminal with a descriptor (tqdm then sizes the bar itself)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return -1


class Progress:
    """``total`` steps of ``label``; ``step`` after each, ``close`` at the end (or use it as a
    context manager). ``force`` draws the bar on a stream that is not a terminal; ``delay``:
    seconds before it first appears (work that ends sooner draws nothing)."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None,
                 force: bool = False, delay: float = 0.0) -> None:
        self.total, self.label, self.done = max(total, 0), label, 0
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(force or (callable(isatty) and isatty()))
        # a terminal that reports no width (some CI pseudo-terminals) would get an empty bar
        sized = self.enabled and _columns(self.stream) > 0
        # disabled: tqdm writes nothing at all (not even on close)
        self._bar = tqdm(total=self.total, desc=label, file=self.stream,
                         disable=not self.enabled, mininterval=0.1, leave=True, delay=delay,
                         dynamic_ncols=sized, **({} if sized or not self.enabled
                                                 else {"ncols": 80, "nrows": 24}))

    def step(self, note: str = "") -> None:
        self.done += 1
        if self.enabled:
            if note:
                self._bar.set_postfix_str(note[:40], refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
