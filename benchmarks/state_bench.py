"""TrainingState vs Horovod's TorchState: commit, sync and training throughput.

One run measures, on the same model (an MLP of about 25M parameters with Adam,
so about 290 MiB of parameters and moments) and two Gloo workers, every
variant in the same processes (same interpreter, same flags, same torch
threads), interleaved round by round so load from other processes falls on
all of them alike:

* commit: ``commit()`` (host copy + Horovod's host check, what the target
  names) against a plain ``copy_`` of the same tensors into preallocated
  buffers; also shown: ``copy_`` followed by the same host check on a bare
  Horovod state (the least any commit does), and ``save()`` (the host copy
  alone);
* sync: ``sync()`` against ONE ``hvd.broadcast_`` of a flat tensor of the same
  bytes: when every rank holds the committed state (after a failure all
  restored from: digests only, nothing moves), when rank 1 lacks it (as a
  joiner: its lineage shows it, nobody hashes, rank 0 sends its committed
  copy), when rank 1 shares rank 0's lineage but its tensors diverged (the
  digests show it, then the same transfer), when rank 1 lacks it after a
  standalone ``check_host_updates()`` (rank 0 copies its live tensors while
  sending), and after such a check when every rank holds it (rank 0 copies,
  the digests show nothing moved);
  Horovod's ``TorchState.sync`` beside them, and the floor of any sync that
  leaves a committed copy beside the live state: the flat broadcast followed
  by the receivers' ``copy_`` of the bytes into a second buffer;
* throughput: a training step + commit against the same step without any
  state library.

Targets (ratios to the baseline measured in the same run, judged on the
median of the per-round ratios): commit <= 1.05x the copy + host check,
sync to a rank lacking the state <= 1.2x (both of rank 0's paths), train
step + commit <= 1.03x.  Each ratio is printed with its baseline, its
sample count and the 90% interval of its median ("unresolved" while the
target lies inside it: run more rounds).

    python benchmarks/state_bench.py [--json PATH] [--rounds N] [--sync-rounds N] [--steps N] [--batch B]

Without Horovod's environment the script starts itself under
``horovodrun -np 2 -H localhost:2``; rank 0 prints the table and writes JSON
(default ``benchmarks/results/state_bench.json``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RESULTS, Row, format_table, load_note, paired_ratio, spread, write_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = RESULTS / "state_bench.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where rank 0 writes the results")
    p.add_argument("--np", type=int, default=2, help="workers to launch (default 2)")
    p.add_argument("--width", type=int, default=4096, help="hidden width of the MLP (4096: ~25M parameters)")
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds of the commit measurements")
    p.add_argument("--sync-rounds", type=int, default=20, help="interleaved rounds of the sync measurements")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per variant (interleaved)")
    p.add_argument("--batch", type=int, default=512, help="per-worker batch of the throughput loop")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    return p.parse_args(argv)


def launch(args: argparse.Namespace) -> int:
    """Run this script under horovodrun and relay its exit code."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [str(horovodrun), "--gloo", "-np", str(args.np), "-H", f"localhost:{args.np}",
           sys.executable, __file__, *sys.argv[1:]]
    return subprocess.call(cmd, env=env)


# -- measurements ----------------------------------------------------------------------------


def mlp(width: int):
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(1024, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )


class Setup:
    """A model and its DistributedOptimizer, identical (same seed) in every setup."""

    def __init__(self, args: argparse.Namespace):
        import torch
        import horovod.torch as hvd

        self.torch = torch
        torch.manual_seed(0)
        self.model = mlp(args.width)
        base = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.optimizer = hvd.DistributedOptimizer(base, named_parameters=self.model.named_parameters())
        self.x = torch.randn(args.batch, 1024)
        self.y = torch.randint(0, 10, (args.batch,))
        for _ in range(2):  # Adam's moments exist from here on
            self.step()

    def step(self) -> None:
        torch = self.torch
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()

    def tensors(self) -> list:
        tensors = list(self.model.state_dict().values())
        for state in self.optimizer.state.values():
            tensors += [v for v in state.values() if self.torch.is_tensor(v)]
        return tensors


class Bench:
    """Each library gets its own copy of the model, so one's sync cannot disturb the other's."""

    def __init__(self, args: argparse.Namespace):
        import torch
        import horovod.torch as hvd

        self.torch, self.hvd, self.args = torch, hvd, args
        self.plain, self.mine, self.other = Setup(args), Setup(args), Setup(args)
        self.barrier()

    def barrier(self) -> None:
        self.hvd.allreduce(self.torch.zeros(1), name="bench.barrier")

    def slowest(self, seconds: list[float]) -> list[float]:
        """Per sample, the largest of every rank's time for the same operation."""
        t = self.torch.tensor(seconds, dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Max, name="bench.max").tolist()

    def timed(self, fns: dict, rounds: int, prepare: dict | None = None) -> dict[str, list[float]]:
        """``rounds`` samples of each fn, the fns interleaved round by round.

        ``prepare[name]`` runs untimed before each sample of ``name``.  A sample
        is the slowest rank's time.
        """
        prepare = prepare or {}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                if name in prepare:
                    prepare[name]()
                self.barrier()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        return {name: self.slowest(t) for name, t in times.items()}

    def run(self) -> dict:
        torch, hvd, args = self.torch, self.hvd, self.args
        from hvd_elastic.training.state import TrainingState, broadcast_host_updates

        tensors = self.plain.tensors()
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        params = sum(p.numel() for p in self.plain.model.parameters())

        # commit ------------------------------------------------------------------------------
        copies = [torch.empty_like(t) for t in tensors]

        def plain_copy():
            for dst, src in zip(copies, tensors):
                dst.copy_(src)

        # The host check a commit makes (TrainingState's one-collective broadcast) on a state holding nothing.
        from horovod.common.elastic import ObjectState
        bare = ObjectState(bcast_object=broadcast_host_updates, get_rank=hvd.rank)

        def copy_and_check():
            plain_copy()
            bare.check_host_updates()

        ours = TrainingState(model=self.mine.model, optimizer=self.mine.optimizer, epoch=0)
        theirs = hvd.elastic.TorchState(model=self.other.model, optimizer=self.other.optimizer, epoch=0)
        ours.sync()  # as run() does first: from here both ranks descend from rank 0's state
        samples = self.timed({
            "copy_": plain_copy,
            "copy_+check": copy_and_check,
            "ours.commit": ours.commit,
            "ours.save": ours.save,
            "torchstate.commit": theirs.commit,
        }, args.rounds)
        copies.clear()  # the copies' memory back before the sync's buffers

        # sync --------------------------------------------------------------------------------
        flat = torch.empty(nbytes // 4, dtype=torch.float32)
        # A sync leaves every receiver with the state twice, live and committed: the bytes it receives
        # are written once more whatever the transfer.  This floor does just that after one broadcast.
        second = torch.empty_like(flat) if hvd.rank() != 0 else None

        def broadcast_and_copy():
            hvd.broadcast_(flat, 0, name="bench.flat")
            if second is not None:
                second.copy_(flat)
        wire: list[float] = []
        ours.add_listener(lambda event, f: wire.append(f["broadcast_seconds"]) if event == "sync" else None)
        def rank_1_moves_on(lockstep: bool):
            """After a failure everyone restored from, rank 1's tensors move, then it saves: alone
            (its lineage is no longer rank 0's, as a joiner's: it is sent everything without
            hashing) or in ``lockstep`` with rank 0 (same lineage: only the digests can tell)."""
            ours.restore()
            if hvd.rank() == 1:
                with torch.no_grad():
                    for t in self.mine.tensors():
                        t.add_(1)
            if lockstep or hvd.rank() == 1:
                ours.save()

        def lacking():
            rank_1_moves_on(lockstep=False)

        def diverged():
            rank_1_moves_on(lockstep=True)

        samples.update(self.timed({
            "broadcast_": lambda: hvd.broadcast_(flat, 0, name="bench.flat"),
            "broadcast_+copy_": broadcast_and_copy,
            "ours.sync (held)": ours.sync,
            "ours.sync (no copy)": ours.sync,
            "ours.sync (copy)": ours.sync,
            "ours.sync (diverged)": ours.sync,
            "ours.sync (copy, held)": ours.sync,
            "torchstate.sync": theirs.sync,
        }, args.sync_rounds, prepare={
            # After a collective failure everyone restored from: every rank holds the
            # committed state, the digests show it, nothing moves.
            "ours.sync (held)": ours.restore,
            # Rank 1 lacks the state; rank 0's tensors are its committed copy, sent as is.
            "ours.sync (no copy)": lacking,
            # Rank 1 lacks the state, and a standalone host check came after the last commit: the
            # live state may have moved on in ways version counters miss, so rank 0 copies it
            # while sending.
            "ours.sync (copy)": lambda: (lacking(), ours.check_host_updates()),
            "ours.sync (diverged)": diverged,
            # The same check where every rank holds the state: rank 0 copies, nothing moves.
            "ours.sync (copy, held)": lambda: (ours.restore(), ours.check_host_updates()),
        }))
        flat.resize_(0)  # its memory back (the lambda above is not called again)
        if second is not None:
            second.resize_(0)
        wire = self.slowest(wire)  # one per ours.sync call: held, no copy, copy, diverged, copy+held, held, ...
        samples["ours.sync (no copy): transfer"] = wire[1::5]
        samples["ours.sync (copy): transfer"] = wire[2::5]

        # throughput: one training step (+ commit) per sample, the variants alternating
        # step by step so that bursts of load from other processes hit them alike.
        def step_then(setup, commit):
            def one_step():
                setup.step()
                commit()
            return one_step

        samples.update(self.timed({
            "step": step_then(self.plain, lambda: None),
            "ours.step+commit": step_then(self.mine, ours.commit),
            "torchstate.step+commit": step_then(self.other, theirs.commit),
        }, args.steps))

        def row(label, name, baseline=None, target=None):
            ratio = paired_ratio(samples[name], samples[baseline]) if baseline else None
            return Row(label, spread(samples[name]), baseline=baseline, ratio=ratio, target=target)

        rows = [
            row("plain copy_ (baseline)", "copy_"),
            row("commit", "ours.commit", "copy_"),
            row("commit, TorchState", "torchstate.commit", "copy_"),
            row("copy_ + host check", "copy_+check", "copy_"),
            row("commit vs the same host check", "ours.commit", "copy_+check", 1.05),
            row("save (host copy only)", "ours.save", "copy_"),
            row("one flat broadcast_ (baseline)", "broadcast_"),
            row("sync, every rank holds it", "ours.sync (held)", "broadcast_"),
            row("broadcast_ + the receivers' copy_ (floor)", "broadcast_+copy_", "broadcast_"),
            row("sync to a rank lacking it", "ours.sync (no copy)", "broadcast_", 1.2),
            row("  vs the floor", "ours.sync (no copy)", "broadcast_+copy_"),
            row("  of which the transfer", "ours.sync (no copy): transfer"),
            row("sync to a rank lacking it, rank 0 copying", "ours.sync (copy)", "broadcast_", 1.2),
            row("  vs the floor", "ours.sync (copy)", "broadcast_+copy_"),
            row("  of which the transfer", "ours.sync (copy): transfer"),
            row("sync after a host check, every rank holds it", "ours.sync (copy, held)", "broadcast_"),
            row("sync to a survivor that diverged (digests)", "ours.sync (diverged)", "broadcast_"),
            row("  vs the floor", "ours.sync (diverged)", "broadcast_+copy_"),
            row("sync, TorchState", "torchstate.sync", "broadcast_"),
            row("train step (baseline)", "step"),
            row("train step + commit", "ours.step+commit", "step", 1.03),
            row("train step + commit, TorchState", "torchstate.step+commit", "step"),
        ]
        return {
            "world_size": hvd.size(),
            "parameters": params,
            "state_bytes": nbytes,
            "torch_threads": torch.get_num_threads(),
            "batch": args.batch,
            "rows": rows,
            "samples_s": samples,
            "samples_note": "seconds per operation (per step for the train rows), slowest rank, one per round",
        }


def main(argv=None) -> int:
    args = parse_args(argv)
    if "HOROVOD_RANK" not in os.environ:
        return launch(args)
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(args.threads)
    hvd.init()
    load_at_start = os.getloadavg()
    report = Bench(args).run()
    if hvd.rank() == 0:
        print(format_table(
            f"{report['parameters'] / 1e6:.1f}M-parameter MLP + Adam, "
            f"{report['state_bytes'] / 2**20:.0f} MiB of state, "
            f"{report['world_size']} Gloo workers, batch {report['batch']}, {report['torch_threads']} torch thread(s), "
            f"{load_note(load_at_start)}; slowest rank per sample, ratios per interleaved round",
            report["rows"]), flush=True)
        report["load_average_start"] = load_at_start
        print(f"wrote {write_json(args.json, report)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
