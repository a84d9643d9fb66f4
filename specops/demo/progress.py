"""A tiny text progress bar for the demo and the benchmark (no third-party dependency)."""

from __future__ import annotations

import sys
import time


class Progress:
    """Redraws one line on stderr: ``label [#####.....] 12/40 3.1s``. Use as a context manager."""

    def __init__(self, total: int, label: str = "", width: int = 30, stream=None):
        self.total = max(int(total), 1)
        self.label = label
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self._last_draw = 0.0
        # On a terminal the line is redrawn in place; in a log, only every quarter gets a line.
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._next_quarter = 1

    def update(self, done: int | None = None, note: str = "") -> None:
        self.done = self.done + 1 if done is None else int(done)
        now = time.perf_counter()
        if self._tty:
            # Redraw at most 20 times a second: drawing must not slow down what is measured.
            if now - self._last_draw < 0.05 and self.done < self.total and self._last_draw:
                return
        elif 4 * self.done < self._next_quarter * self.total:
            return
        else:
            self._next_quarter = 4 * self.done // self.total + 1
        self._last_draw = now
        filled = min(self.width, self.width * self.done // self.total)
        bar = "#" * filled + "." * (self.width - filled)
        text = f"{self.label} [{bar}] {min(self.done, self.total)}/{self.total} {now - self.start:5.1f}s {note}"
        self.stream.write(f"\r{text:<100}" if self._tty else text.rstrip() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._tty:
            self._last_draw = 0.0  # always draw the final state
            self.update(self.done)
            self.stream.write("\n")
        elif self.done < self.total:  # stopped early: say where
            self._next_quarter = 0
            self.update(self.done)
        self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
