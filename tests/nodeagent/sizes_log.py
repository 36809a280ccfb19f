"""Reading what ``worker_sizes.py`` logged: used by the end-to-end test and the drain benchmark."""

from __future__ import annotations

import glob
import json
import subprocess
import time
from pathlib import Path


def read_rows(directory: Path) -> list[dict]:
    """Every complete row any worker wrote, oldest first."""
    rows = []
    for path in glob.glob(str(directory / "sizes.*.jsonl")):
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # being written
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise AssertionError(f"{path}:{number}: {line!r}: {exc}") from None
    return sorted(rows, key=lambda r: r["time"])


def rank0_sequence(rows: list[dict]) -> list[int]:
    """World sizes rank 0 trained at, in order, repeats collapsed."""
    seq: list[int] = []
    for row in rows:
        if row["event"] == "step" and row["rank"] == 0 and (not seq or seq[-1] != row["size"]):
            seq.append(row["size"])
    return seq


def wait_for_size(directory: Path, size: int, job: subprocess.Popen, timeout: float = 90.0, since: float = 0.0) -> float:
    """Wait until rank 0 steps at ``size`` (after wall time ``since``); returns that step's time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = read_rows(directory)
        seq = rank0_sequence(rows)
        if seq and seq[-1] == size:
            step = next((r for r in rows if r["event"] == "step" and r["rank"] == 0 and r["size"] == size and r["time"] > since), None)
            if step is not None:
                return step["time"]
        assert job.poll() is None, f"horovodrun exited early with {job.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"world size never reached {size}; saw {rank0_sequence(read_rows(directory))}")
