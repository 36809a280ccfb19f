"""The demo's terminal output: event lines, and one live status line while it waits.

On a terminal the status line (step, epoch, world size, loss, last event) is
rewritten in place on every :meth:`Console.refresh`; when stdout is not a
terminal (a log file, CI) there is no status line at all, only event lines.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from hvd_elastic.report.jsonlines import JsonLines


class Console:
    def __init__(self, progress: JsonLines, stream: TextIO | None = None):
        self.progress = progress
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self.last_event = "-"
        self._shown = ""  # the status line on screen now ("" when none)

    def say(self, message: str, event: str | None = None) -> None:
        """Print an event line (above the status line); ``event`` becomes the status line's last event."""
        if event is not None:
            self.last_event = event
        self._clear()
        print(f"[demo {time.strftime('%H:%M:%S')}] {message}", file=self.stream, flush=True)

    def refresh(self) -> None:
        """Redraw the status line from the newest progress row (no-op when stdout is not a terminal)."""
        if not self.live:
            return
        rows = self.progress.rows()
        if not rows:
            return
        row = rows[-1]
        loss = row.get("loss")
        text = (f"  step {row['step']:>4}  epoch {row.get('epoch', '?')}  world size {row['size']}  "
                f"loss {loss:.4f}  last event: {self.last_event}" if isinstance(loss, (int, float)) else
                f"  step {row['step']:>4}  world size {row['size']}  last event: {self.last_event}")
        if self._shown == text:
            return  # nothing new: a terminal left alone while training waits on a reset
        self.stream.write("\r\033[K" + text)
        self.stream.flush()
        self._shown = text

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self._shown = ""
