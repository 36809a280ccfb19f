"""The end-of-run exactly-once verdict on the evidence a job left behind (:mod:`hvd_elastic.report.evidence`).

``hvd-elastic report`` prints it for a run directory with a ``ledger/``; the demo
and the test bed's fault matrix judge their runs with it.

The rule for rolled-back steps (:func:`committed_samples`, the one place it is
applied): a ledger record counts only if its step key ``[epoch, offset,
world_size, step_samples]`` is in rank 0's final committed ``history``.  A step
that ran but was rolled back (a crash before its commit, a reset that restored
an older commit, a job restarted from an older checkpoint) is either absent from
the history or replayed under the same key; a replay must carry the same indices
on the same rank, and that is checked.  Every committed step must have the
records of every rank of its world.

Rank agreement proves little on its own: after any failure every rank is synced
from rank 0, so the ranks are equal by construction, also when rank 0 itself is
wrong.  So the verdict also checks each rank against the committed history
alone (:func:`chain_problems`, :func:`step_problems`):

* the LR scheduler's ``last_epoch`` and every optimizer state's ``step`` equal
  the number of committed steps (a step applied twice, or one lost, moves them);
* the committed ``digests`` chain: each committed step records the digest of
  parameters and optimizer state before and after it; each step must start from
  what the previous one ended with, and the final state must be what the last
  one ended with.  A step replayed on a model that already took it, a restore
  from the wrong commit, or a resume whose model is a fresh initialisation (that
  the sync then made equal everywhere) all break a link.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

from .jsonlines import JsonLines


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


def committed_samples(records: Iterable[dict], history: Iterable) -> tuple[dict[int, collections.Counter], list[str]]:
    """Apply the rule of rolled-back steps: (per epoch, how often each sample was trained; errors).

    ``records`` are ledger rows (``key``, ``rank``, ``idx``), ``history`` rank 0's
    committed step keys.
    """
    errors: list[str] = []
    by_step: dict[tuple, dict[int, list[int]]] = collections.defaultdict(dict)
    for rec in records:
        key = tuple(rec["key"])
        first = by_step[key].setdefault(rec["rank"], rec["idx"])
        if first != rec["idx"]:
            errors.append(f"rank {rec['rank']} trained two different batches under step {list(key)}")
    per_epoch: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for key in map(tuple, history):
        epoch, _, world, _ = key
        have = sorted(by_step.get(key, {}))
        if have != list(range(world)):
            errors.append(f"committed step {list(key)} has records of ranks {have}, expected 0..{world - 1}")
        for idx in by_step.get(key, {}).values():
            per_epoch[epoch].update(idx)
    return per_epoch, errors


def chain_problems(history: list, digests: list | None) -> list[str]:
    """Breaks in rank 0's committed ``digests`` chain (see the module docstring)."""
    if digests is None:
        return ["no committed digests chain in rank 0's final"]
    if len(digests) != len(history):
        return [f"{len(digests)} committed digests for {len(history)} committed steps"]
    for i in range(1, len(history)):
        if digests[i][0] != digests[i - 1][1]:
            return [f"committed step {history[i]} started from a state that is not what step {history[i - 1]} "
                    f"ended with: a step applied twice, or a restore or resume from the wrong state"]
    return []


def step_problems(final: dict, history: list, digests: list | None) -> list[str]:
    """What one rank's ``final`` says against the committed steps and their digests."""
    steps, rank = len(history), final["rank"]
    found = []
    last_epoch = final["scheduler"].get("last_epoch")
    if last_epoch is not None and last_epoch != steps:
        found.append(f"rank {rank}: scheduler last_epoch {last_epoch} after {steps} committed steps")
    wrong = [s for s in final.get("optimizer_steps", []) if s != steps]
    if wrong:
        found.append(f"rank {rank}: optimizer state step {sorted(set(wrong))} after {steps} committed steps")
    if digests and len(digests) == steps and final["checksum"] != digests[-1][1]:
        found.append(f"rank {rank}: final state is not what the last committed step {history[-1]} ended with")
    return found


def verdict(out: Path) -> Verdict:
    """Check the finals and the ledger under ``out`` (see the module docstring for the rules)."""
    finals = [json.loads(p.read_text()) for p in sorted(Path(out).glob("final-*.json"))]
    errors: list[str] = []
    if not finals:
        return Verdict(0, 0, 0, False, 0, 0, ["no final-<rank>.json: the job did not finish"])
    ranks = sorted(f["rank"] for f in finals)
    if ranks != list(range(finals[0]["size"])):
        errors.append(f"finals of ranks {ranks}, expected 0..{finals[0]['size'] - 1}")
    rank0 = next((f for f in finals if f["rank"] == 0), finals[0])
    identical = all(f["checksum"] == rank0["checksum"] and f["scheduler"] == rank0["scheduler"] for f in finals)
    history = rank0["history"] or []
    errors += chain_problems(history, rank0.get("digests"))
    for final in finals:
        errors += step_problems(final, history, rank0.get("digests"))

    per_epoch, ledger_errors = committed_samples(JsonLines(Path(out) / "ledger" / "*.jsonl").rows(), history)
    errors += ledger_errors
    lost = duplicated = 0
    everything = range(rank0["samples"])
    for epoch in range(rank0["epochs"]):
        counts = per_epoch.get(epoch, collections.Counter())
        lost += sum(1 for i in everything if counts[i] == 0)
        duplicated += sum(c - 1 for c in counts.values() if c > 1)
    return Verdict(len(finals), rank0["epochs"], rank0["samples"], identical, lost, duplicated, errors)


def run_problems(out: Path, result: Verdict | None = None) -> list[str]:
    """Every broken promise of a finished run in ``out``: the :func:`verdict`'s ``problems()`` (``result``, if
    already computed), a checkpoint that was reported durable and later skipped as invalid, a half-written
    checkpoint left in ``out/ckpt``, and an event log that does not end with ``finish``."""
    from hvd_elastic.training.events import EventLog  # the ledger alone needs nothing of the training package

    found = (result or verdict(out)).problems()
    events = EventLog.read(Path(out) / "events.jsonl")
    durable = {e.get("path") for e in events if e["event"] == "checkpoint"}
    found += [f"checkpoint {e.get('path')} was reported durable, then skipped: {e.get('reason')}"
              for e in events if e["event"] == "checkpoint_skipped" and e.get("path") in durable]
    found += [f"half-written checkpoint {p.name} left behind" for p in (Path(out) / "ckpt").glob(".tmp-*")]
    if not events or events[-1]["event"] != "finish":
        found.append(f"the event log ends with {events[-1]['event'] if events else 'nothing'}, not finish")
    return found
