"""The per-sample ledger of benchmarks/peers.py: written alike by every stack's training script, judged here.

Each stack keeps its own books (Horovod's commits, torchrun's restarts,
torchft's quorum steps); the comparison trusts none of them.  Every rank of
every stack appends one row per optimizer step it applied (written before
Horovod's commit, which may raise after saving; torchft: a committed step) to
``OUT/ledger/<host>-<pid>.jsonl``::

    {"t": unix time, "step": n, "chain": c, "parent": p, "epoch": e, "size": world size,
     "rank": r, "samples": [dataset indices], "loss": mean loss of the step}

``chain`` is a value carried in the training state itself (committed,
restored, checkpointed, healed with it): ``link(parent, token, step)``, where
the token is drawn anew at every (re)start of the training function.  A step
thrown away (a rollback to the last commit, a restart from an older
checkpoint, a restart from scratch) leaves rows whose chain no later step
descends from.  At the end rank 0 writes ``OUT/final.json`` with the final
chain; walking parents from it gives the steps that made the final model, and
only their samples count.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field


def link(parent: int, token: int, step: int) -> int:
    """The chain value after ``step``: the same on every rank that shares ``parent`` and ``token``."""
    digest = hashlib.blake2b(f"{parent}:{token}:{step}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")


class Writer:
    """One process's ledger file (line-buffered: a SIGKILL loses at most the row being written)."""

    def __init__(self, out: str, host: str, stack: str):
        os.makedirs(os.path.join(out, "ledger"), exist_ok=True)
        self.stack = stack
        self._file = open(os.path.join(out, "ledger", f"{host}-{os.getpid()}.jsonl"), "a", buffering=1)

    def step(self, t: float, step: int, chain: int, parent: int, epoch: int, size: int, rank: int,
             samples: list[int], loss: float) -> None:
        self._file.write(json.dumps({"t": round(t, 4), "step": step, "chain": chain, "parent": parent,
                                     "epoch": epoch, "size": size, "rank": rank, "samples": samples,
                                     "loss": round(loss, 6)}) + "\n")


def read_rows(out: str) -> list[dict]:
    """Every ledger row of a run, in time order (a torn last line of a killed process is skipped)."""
    rows = []
    for path in glob.glob(os.path.join(out, "ledger", "*.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    rows.sort(key=lambda row: row["t"])
    return rows


@dataclass
class Verdict:
    """What the ledger says about one run."""

    kept: set[int] = field(default_factory=set)  # chain values of the steps the final model descends from
    steps_thrown: int = 0  # step attempts (one chain value) no kept step descends from
    epochs: dict[int, dict[str, int]] = field(default_factory=dict)  # epoch -> trained, lost, duplicated
    unique_samples: int = 0  # distinct (epoch, sample) pairs the kept steps trained, every epoch counted
    broken: str = ""  # why the chain could not be walked ('' when it could)

    @property
    def steps_kept(self) -> int:
        return len(self.kept)

    @property
    def lost(self) -> int:
        return sum(e["lost"] for e in self.epochs.values())

    @property
    def duplicated(self) -> int:
        return sum(e["duplicated"] for e in self.epochs.values())


def kept_chains(rows: list[dict], final_chain: int) -> tuple[set[int], int]:
    """The chain values of the steps the final model descends from, and where the walk ended (0: the start)."""
    parents = {row["chain"]: row["parent"] for row in rows}
    kept, chain = set(), final_chain
    while chain in parents and chain not in kept:
        kept.add(chain)
        chain = parents[chain]
    return kept, chain


def judge(rows: list[dict], final_chain: int, samples: int, complete_epochs: int) -> Verdict:
    """Walk the chain back from ``final_chain``; count each kept epoch's samples against ``samples``.

    Only the first ``complete_epochs`` epochs are judged (a run stopped mid-epoch has not seen them all).
    """
    by_chain: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        by_chain[row["chain"]].append(row)
    kept, root = kept_chains(rows, final_chain)
    verdict = Verdict(kept=kept, steps_thrown=len(by_chain) - len(kept))
    if root != 0:
        verdict.broken = f"the chain breaks at {root}: a kept step's parent has no row"
    trained: dict[int, Counter] = defaultdict(Counter)
    for chain in kept:
        for row in by_chain[chain]:
            trained[row["epoch"]].update(row["samples"])
    verdict.unique_samples = sum(len(counts) for counts in trained.values())
    for epoch in range(complete_epochs):
        counts = trained.get(epoch, Counter())
        verdict.epochs[epoch] = {"trained": sum(counts.values()), "lost": samples - len(counts),
                                 "duplicated": sum(n - 1 for n in counts.values() if n > 1)}
    return verdict


def tip(rows: list[dict]) -> tuple[int, int]:
    """Where a run cut off unfinished stood: the chain value and epoch of its newest step (nothing after it
    can have rolled it back), or (-1, 0) with no step at all."""
    if not rows:
        return -1, 0
    newest = max(rows, key=lambda row: row["t"])
    return newest["chain"], newest["epoch"]


def kept_steps(rows: list[dict], kept: set[int]) -> list[tuple[float, int]]:
    """(time, world size) of every kept step, as its first rank wrote it, in time order."""
    first: dict[int, tuple[float, int]] = {}
    for row in rows:  # in time order
        if row["chain"] in kept and row["chain"] not in first:
            first[row["chain"]] = (row["t"], row["size"])
    return sorted(first.values())


def recoveries(faults: list[dict], steps: list[tuple[float, int]], end: float) -> dict[str, dict[str, list]]:
    """Per fault kind, what each injected fault cost, in seconds, from ``steps`` (:func:`kept_steps`):

    * ``pause``: the longest stretch without a kept step between the fault and the next one (or ``end``),
      the stretch from the fault itself included: how long training stood still (for a join, the
      survivors' pause);
    * ``resize``: the fault -> the first kept step at another world size than just before it, or None
      when the size did not change before the next fault (a fault healed, or recovered in place).
    """
    injected = sorted((f for f in faults if "skipped" not in f), key=lambda f: f["time"])
    out: dict[str, dict[str, list]] = {}
    for i, fault in enumerate(injected):
        start = fault["time"]
        stop = injected[i + 1]["time"] if i + 1 < len(injected) else end
        before = [size for t, size in steps if t <= start]
        inside = [(t, size) for t, size in steps if start < t <= stop]
        times = [start, *(t for t, _ in inside), stop]
        resize = next((round(t - start, 2) for t, size in inside if before and size != before[-1]), None)
        entry = out.setdefault(fault["kind"], {"pause": [], "resize": []})
        entry["pause"].append(round(max(b - a for a, b in zip(times, times[1:])), 2))
        entry["resize"].append(resize)
    return out

