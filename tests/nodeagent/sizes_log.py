"""Reading what ``worker_sizes.py`` logged: used by the end-to-end test and the drain benchmark."""

from __future__ import annotations

import glob
import json
import subprocess
import time
from pathlib import Path


class SizesLog:
    """The rows every worker wrote under ``directory``, read incrementally (workers write fast)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._offsets: dict[str, int] = {}
        self._rows: list[dict] = []

    def rows(self) -> list[dict]:
        """Every complete row so far, oldest first."""
        for path in glob.glob(str(self.directory / "sizes.*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]  # a row being written waits for the next read
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    self._rows.append(json.loads(line))
                except ValueError as exc:
                    raise AssertionError(f"{path}: {line!r}: {exc}") from None
        self._rows.sort(key=lambda r: r["time"])
        return self._rows

    def sequence(self) -> list[int]:
        """World sizes rank 0 trained at, in order, repeats collapsed."""
        seq: list[int] = []
        for row in self.rows():
            if row["event"] == "step" and row["rank"] == 0 and (not seq or seq[-1] != row["size"]):
                seq.append(row["size"])
        return seq

    def wait_for_size(self, size: int, job: subprocess.Popen, timeout: float = 90.0, since: float = 0.0) -> float:
        """Wait for rank 0's first step at ``size`` after wall time ``since``; returns that step's time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for row in self.rows():
                if row["time"] > since and row["event"] == "step" and row["rank"] == 0 and row["size"] == size:
                    return row["time"]
            assert job.poll() is None, f"horovodrun exited early with {job.returncode}"
            time.sleep(0.05)
        raise AssertionError(f"world size never reached {size}; saw {self.sequence()}")
