"""A progress bar on stderr for long profiling work (quiet when stderr is not a terminal,
unless forced)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None, force: bool = False):
        self.total, self.label, self.done = max(total, 0), label, 0
        self.stream = stream or sys.stderr
        self.enabled = force or getattr(self.stream, "isatty", lambda: False)()
        self.start = time.perf_counter()
        self._last = 0.0

    def step(self, note: str = "") -> None:
        self.done += 1
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done == self.total):
            self._last = now
            width = 30
            filled = int(width * self.done / self.total) if self.total else width
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} "
                              f"{now - self.start:5.1f}s {note[:40]:<40}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
