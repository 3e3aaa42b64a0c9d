"""A one-line progress indicator on stderr, for long `stratad ctl` operations.

Hand-written (a dozen lines of logic) rather than a dependency: it draws
``label [#####-----] 12/40 30% 1.2s`` for counted work and a spinner with the
elapsed time for work of unknown length (a Verify or CollectGarbage call),
redrawn at most ten times a second, and only on a terminal unless forced.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_SPINNER = "|/-\\"
_WIDTH = 24


class Progress:
    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        interval: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.interval = interval
        self.done = 0
        self.started = time.monotonic()
        self._drawn_at = 0.0
        self._ticks = 0
        self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int | None = None, total: int | None = None) -> None:
        """Record progress (``done`` of ``total``) and redraw if it is time to."""
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        now = time.monotonic()
        if self.enabled and now - self._drawn_at >= self.interval:
            self._draw(now)

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def line(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self.started
        if not self.total:
            spin = _SPINNER[self._ticks % len(_SPINNER)]
            return f"{self.label} {spin} {elapsed:.1f}s"
        fraction = min(self.done / self.total, 1.0)
        filled = int(fraction * _WIDTH)
        bar = "#" * filled + "-" * (_WIDTH - filled)
        return f"{self.label} [{bar}] {self.done}/{self.total} {fraction:4.0%} {elapsed:.1f}s"

    def _draw(self, now: float) -> None:
        self._ticks += 1
        self._drawn_at = now
        text = self.line(now)
        pad = " " * max(self._width - len(text), 0)
        self._width = len(text)
        self.stream.write(f"\r{text}{pad}")
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (nothing if never enabled)."""
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False


__all__ = ["Progress"]
