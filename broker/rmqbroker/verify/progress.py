"""A one-line progress display for terminals; silent when stdout is not a tty (logs, pods)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done: int, total: int, nbytes: int, what: str = "chunks", force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        width = 30
        filled = width * done // total if total else width
        rate = nbytes / max(now - self.started, 1e-6) / 1e6
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what} "
                          f"{nbytes / 1e6:,.1f} MB {rate:,.1f} MB/s ")
        self.stream.flush()
        self._shown = True

    def message(self, text: str) -> None:
        if self.enabled:
            self.close()
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
