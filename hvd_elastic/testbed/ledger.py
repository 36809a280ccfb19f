"""The end-of-run verdict on what :mod:`hvd_elastic.testbed.worker` left behind.

The rule for rolled-back steps: a ledger record counts only if its step key
``[epoch, offset, world_size, step_samples]`` is in rank 0's final committed
``history``.  A step that ran but was rolled back (a crash before its commit,
a reset that restored an older commit, a job restarted from an older
checkpoint) is either absent from the history or replayed under the same key;
a replay must carry the same indices on the same rank, and that is checked.
Every committed step must have the records of every rank of its world.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

from .records import JsonLines


@dataclasses.dataclass
class Verdict:
    """What a finished run proves; :meth:`problems` lists every broken promise."""

    ranks: int
    epochs: int
    samples: int
    params_identical: bool
    lost: int  # samples of a completed epoch that no committed step trained on
    duplicated: int  # extra trainings of a sample within a completed epoch
    errors: list[str]

    def problems(self) -> list[str]:
        found = list(self.errors)
        if not self.params_identical:
            found.append("ranks ended with different parameter/optimizer checksums")
        if self.lost or self.duplicated:
            found.append(f"{self.lost} samples lost and {self.duplicated} duplicated in completed epochs")
        if self.epochs < 1:
            found.append("no epoch completed")
        return found


def verdict(out: Path) -> Verdict:
    """Check the finals and the ledger under ``out`` (see the module docstring for the rule)."""
    finals = [json.loads(p.read_text()) for p in sorted(Path(out).glob("final-*.json"))]
    errors: list[str] = []
    if not finals:
        return Verdict(0, 0, 0, False, 0, 0, ["no final-<rank>.json: the job did not finish"])
    ranks = sorted(f["rank"] for f in finals)
    if ranks != list(range(finals[0]["size"])):
        errors.append(f"finals of ranks {ranks}, expected 0..{finals[0]['size'] - 1}")
    rank0 = next((f for f in finals if f["rank"] == 0), finals[0])
    identical = all(f["checksum"] == rank0["checksum"] and f["scheduler"] == rank0["scheduler"] for f in finals)

    records: dict[tuple, dict[int, list[int]]] = collections.defaultdict(dict)
    for rec in JsonLines(Path(out) / "ledger" / "*.jsonl").rows():
        key = tuple(rec["key"])
        first = records[key].setdefault(rec["rank"], rec["idx"])
        if first != rec["idx"]:
            errors.append(f"rank {rec['rank']} trained two different batches under step {list(key)}")
    per_epoch: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for key in map(tuple, rank0["history"] or []):
        epoch, _, world, _ = key
        have = sorted(records.get(key, {}))
        if have != list(range(world)):
            errors.append(f"committed step {list(key)} has records of ranks {have}, expected 0..{world - 1}")
        for idx in records.get(key, {}).values():
            per_epoch[epoch].update(idx)
    lost = duplicated = 0
    everything = range(rank0["samples"])
    for epoch in range(rank0["epochs"]):
        counts = per_epoch.get(epoch, collections.Counter())
        lost += sum(1 for i in everything if counts[i] == 0)
        duplicated += sum(c - 1 for c in counts.values() if c > 1)
    return Verdict(len(finals), rank0["epochs"], rank0["samples"], identical, lost, duplicated, errors)
