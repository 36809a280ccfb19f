"""Reading the JSON-lines files of a run (progress rows, ledgers) while its workers still append to them.

What the demo's status line, the ledger verdict (:mod:`.ledger`) and the test bed read through.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path


class JsonLines:
    """Every complete line of the files matching ``pattern``, read incrementally.

    Workers append while the reader polls, so a line is taken only once its
    newline is written; a torn last line left by a SIGKILLed writer is never
    taken (it has no newline).  :meth:`rows` returns a new list of every row read
    so far, :meth:`new_rows` only those no earlier call returned.  Each file's rows
    keep their order; the rows a call finds come after those of earlier calls
    (files in path order within a call), so rows of different files interleave:
    sort on a field (``time``, ``step``) where the order across files matters.
    """

    def __init__(self, pattern: str | Path):
        self.pattern = str(pattern)
        self._offsets: dict[str, int] = {}
        self._rows: list[dict] = []

    def rows(self) -> list[dict]:
        self.new_rows()
        return list(self._rows)

    def new_rows(self) -> list[dict]:
        first = len(self._rows)
        for path in sorted(glob.glob(self.pattern)):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    self._rows.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path}: not a JSON line {line[:200]!r}: {exc}") from None
        return self._rows[first:]
