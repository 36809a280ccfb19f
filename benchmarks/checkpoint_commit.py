"""What durable checkpoints add to the commit path and to training throughput.

One process (checkpoints are written by rank 0 alone; ``hvd.init()`` without a
launcher gives a world of one), a TrainingState over an MLP with Adam, every
variant in the same process, interleaved round by round:

* plain commit    -- ``state.commit()`` with no checkpointing: the baseline;
* due commit, copy on commit path -- ``state.commit()`` when the checkpoint listener
                     finds a write due and copies the snapshot into reused staging
                     buffers before handing it to the writer thread;
* due commit, copy in writer -- the same, but the writer thread takes the copy under
                     ``state.snapshot_lock`` (what ``hvd_elastic.run`` does): the commit
                     path only hands over, and the NEXT commit (after a training
                     step) waits for the lock if the copy is not done yet;
* idle commit     -- ``CheckpointManager.commit`` when nothing is due;
* background write -- from the due commit's return until the checkpoint is durable
                     (serialise, sha256, fsync, rename), for both kinds of due commit;
* throughput      -- seconds for ``--steps`` training steps with a commit every step:
                     without checkpoints (the baseline), and with a checkpoint every
                     ``--every`` commits copying on the commit path or in the writer.
                     Each run's clock stops after ``CheckpointManager.close()``, so
                     every write it started is timed, the last one included.

Checkpoints go to a fresh directory under ``--dir`` (default ``/var/tmp``, which
is disk-backed on Debian, unlike a tmpfs ``/tmp``), removed at the end; the
table names the filesystem type it found there.  Every throughput run writes
to a directory of its own.

    python benchmarks/checkpoint_commit.py [--params 4000000] [--steps 40] [--every 20] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

import horovod.torch as hvd

from hvd_elastic.training.checkpoint import CheckpointManager
from hvd_elastic.training.state import TrainingState

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402

WIDTH = 1024


def build(params: int) -> TrainingState:
    depth = max(1, params // (WIDTH * WIDTH))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(depth)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    state = TrainingState(model=model, optimizer=optimizer, step=0)
    train_step(state)  # materialise Adam's state
    state.commit()
    return state


def train_step(state: TrainingState, batch: int = 32) -> None:
    state.optimizer.zero_grad()
    state.model(torch.randn(batch, WIDTH)).square().mean().backward()
    state.optimizer.step()
    state.step += 1


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def filesystem(path: Path) -> str:
    """Type and source of the filesystem holding ``path``, from /proc/self/mounts."""
    path = path.resolve()
    best, found = "", "unknown"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                source, mount, fstype = line.split()[:3]
                if (path == Path(mount) or Path(mount) in path.parents) and len(mount) >= len(best):
                    best, found = mount, f"{fstype} ({source} on {mount})"
    except OSError:
        pass
    return found


class Checkpointing:
    """The listener the run decorator installs, with a switch."""

    def __init__(self, state: TrainingState) -> None:
        self.state, self.manager, self.enabled = state, None, False
        state.add_listener(self)

    def __call__(self, event: str, fields: dict) -> None:
        if self.enabled and event == "commit":
            self.manager.commit(self.state.snapshot, step=self.state.step, commit_count=fields["commit_count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=4_000_000, help="model parameters (default 4M)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per throughput run")
    parser.add_argument("--every", type=int, default=20, help="checkpoint every N commits in the throughput runs")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved throughput rounds")
    parser.add_argument("--repeat", type=int, default=20, help="interleaved rounds of the commit timings")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"),
                        help="parent of the (fresh, removed afterwards) checkpoint directory; default /var/tmp")
    parser.add_argument("--json", type=Path, default=RESULTS / "checkpoint_commit.json",
                        help="result file (default benchmarks/results/checkpoint_commit.json)")
    args = parser.parse_args()
    load_at_start = os.getloadavg()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    state = build(args.params)
    listener = Checkpointing(state)
    fs = filesystem(args.dir)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="hvd-elastic-checkpoint-bench.") as tmp:
        def manager(name: str, every: int = 1, locked: bool = True) -> CheckpointManager:
            return CheckpointManager(Path(tmp) / name, every_commits=every, keep_last=2,
                                     lock=state.snapshot_lock if locked else None)

        # Interleaved: plain commit, due commit copying on the commit path, due
        # commit copying in the writer and the commit after the next training step
        # (which may wait for the copy); each due commit's write is timed to its
        # end, so the next due commit finds the writer idle.
        on_path, in_writer = manager("on-path", locked=False), manager("in-writer")
        s = {k: [] for k in ("plain", "on_path", "on_path_write", "in_writer", "next", "in_writer_write")}
        for _ in range(args.repeat):
            listener.enabled = False
            train_step(state)
            s["plain"].append(seconds(state.commit))
            listener.enabled, listener.manager = True, on_path
            t0 = time.perf_counter()
            state.commit()
            s["on_path"].append(time.perf_counter() - t0)
            s["on_path_write"].append(seconds(on_path.flush) + s["on_path"][-1])
            listener.manager = in_writer
            t0 = time.perf_counter()
            state.commit()
            s["in_writer"].append(time.perf_counter() - t0)
            listener.enabled = False
            train_step(state)
            s["next"].append(seconds(state.commit))
            in_writer.flush()
            s["in_writer_write"].append(time.perf_counter() - t0)
        listener.enabled = False
        nbytes = in_writer.load_latest().manifest["bytes"]
        on_path.close()
        in_writer.close()
        never = manager("idle", every=10**9)
        idle = [seconds(lambda: never.commit(state.snapshot)) for _ in range(args.repeat * 20)]
        never.close()

        runs = 0

        def run(every: int | None, locked: bool = True) -> float:
            nonlocal runs
            runs += 1
            listener.manager = manager(f"run-{runs}", every=every or 1, locked=locked)
            listener.enabled = every is not None
            t0 = time.perf_counter()
            for _ in range(args.steps):
                train_step(state)
                state.commit()
            listener.manager.close()  # waits for the write in flight: it is timed too
            listener.enabled = False
            return time.perf_counter() - t0

        run(None)  # warm-up
        t = {"plain": [], "on_path": [], "in_writer": []}
        for _ in range(args.rounds):
            t["plain"].append(run(None))
            t["on_path"].append(run(args.every, locked=False))
            t["in_writer"].append(run(args.every))

    def row(label, samples, baseline=None, base_name=None, unit="s"):
        ratio = paired_ratio(samples, baseline) if baseline is not None else None
        return Row(label, spread(samples), unit=unit, baseline=base_name, ratio=ratio)

    per_step = args.steps
    rows = [
        row("plain commit (baseline)", s["plain"]),
        row("due commit, copy on commit path", s["on_path"], s["plain"], "plain commit"),
        row("due commit, copy in writer (run)", s["in_writer"], s["plain"], "plain commit"),
        row("  next commit, after a step", s["next"], s["plain"], "plain commit"),
        row("commit with nothing due (listener)", idle),
        row("write, copy on path: commit to durable", s["on_path_write"]),
        row("write, copy in writer: commit to durable (a step overlaps)", s["in_writer_write"]),
        row("write rate, copy on path", [nbytes / 1e6 / w for w in s["on_path_write"]], unit="MB/s"),
        row(f"{per_step} steps, commit every step (baseline)", t["plain"]),
        row(f"  + checkpoint every {args.every}, copy on path", t["on_path"], t["plain"], "no checkpoints"),
        row(f"  + checkpoint every {args.every}, copy in writer", t["in_writer"], t["plain"], "no checkpoints"),
    ]
    print(format_table(
        f"checkpoints of {nbytes / 1e6:.1f} MB ({args.params / 1e6:.0f}M parameters + Adam) on {fs} under {args.dir}, "
        f"1 torch thread, {load_note(load_at_start)}; throughput runs time close() too", rows))
    report = {"params": args.params, "checkpoint_bytes": nbytes, "checkpoint_every": args.every, "steps": args.steps,
              "directory": str(args.dir), "filesystem": fs, "rows": rows, "load_average_start": load_at_start,
              "samples_s": {**s, "idle": idle, **{f"run_{k}": v for k, v in t.items()}}}
    print(f"wrote {write_json(args.json, report)}")


if __name__ == "__main__":
    main()
