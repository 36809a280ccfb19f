"""TrainingState vs Horovod's TorchState: commit, sync and training throughput.

One run measures, on the same model (an MLP of about 26M parameters with Adam,
so about 312 MB of parameters and moments) and two Gloo workers:

* commit: ``save()`` (the host copy) and ``commit()`` (save + Horovod's host
  check) against a plain ``copy_`` of the same tensors into preallocated
  buffers;
* sync: ``sync()`` against ONE ``hvd.broadcast_`` of a flat tensor of the
  same bytes;
* throughput: a training loop committing every step against the same loop
  without any state library.

Targets (ratios to the baseline measured in the same run): commit <= 1.2x,
sync <= 1.3x, throughput within 3%.

    python benchmarks/state_bench.py [--json PATH] [--steps N] [--batch B]

Without Horovod's environment the script starts itself under
``horovodrun -np 2 -H localhost:2``; rank 0 prints the table and writes JSON
(default ``benchmarks/results/state_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "benchmarks" / "results" / "state_bench.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where rank 0 writes the results")
    p.add_argument("--np", type=int, default=2, help="workers to launch (default 2)")
    p.add_argument("--width", type=int, default=4096, help="hidden width of the MLP (4096: ~26M parameters)")
    p.add_argument("--reps", type=int, default=7, help="repetitions of each commit/sync measurement")
    p.add_argument("--steps", type=int, default=9, help="timed training steps per variant (interleaved)")
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

    def slowest(self, seconds: float) -> float:
        """The largest of every rank's time for the same operation."""
        t = self.torch.tensor([seconds], dtype=self.torch.float64)
        return self.hvd.allreduce(t, op=self.hvd.Max, name="bench.max").item()

    def timed(self, fns: dict, reps: int | None = None) -> dict[str, dict[str, float]]:
        """Each fn's time on the slowest rank: median and best of ``--reps`` rounds.

        The variants run interleaved, round by round, so load from other
        processes on the machine falls on all of them alike.
        """
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(reps or self.args.reps):
            for name, fn in fns.items():
                self.barrier()
                start = time.perf_counter()
                fn()
                times[name].append(self.slowest(time.perf_counter() - start))
        return {name: {"median": statistics.median(t), "best": min(t)} for name, t in times.items()}

    def run(self) -> dict:
        torch, hvd = self.torch, self.hvd
        from hvd_elastic.training.state import TrainingState

        tensors = self.plain.tensors()
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        params = sum(p.numel() for p in self.plain.model.parameters())

        # commit ------------------------------------------------------------------------------
        copies = [torch.empty_like(t) for t in tensors]

        def plain_copy():
            for dst, src in zip(copies, tensors):
                dst.copy_(src)

        ours = TrainingState(model=self.mine.model, optimizer=self.mine.optimizer, epoch=0)
        theirs = hvd.elastic.TorchState(model=self.other.model, optimizer=self.other.optimizer, epoch=0)
        results = self.timed({
            "copy_": plain_copy,
            "ours.save": ours.save,
            "ours.commit": ours.commit,
            "torchstate.save": theirs.save,
            "torchstate.commit": theirs.commit,
        })
        del copies

        # sync --------------------------------------------------------------------------------
        flat = torch.empty(nbytes // 4, dtype=torch.float32)
        wire: list[float] = []
        ours.add_listener(lambda event, f: wire.append(f["broadcast_seconds"]) if event == "sync" else None)
        results.update(self.timed({
            "broadcast_": lambda: hvd.broadcast_(flat, 0, name="bench.flat"),
            "ours.sync": ours.sync,
            "torchstate.sync": theirs.sync,
        }))
        del flat
        results["ours.sync.broadcast"] = {"median": self.slowest(statistics.median(wire)),
                                          "best": self.slowest(min(wire))}

        # throughput: one training step (+ commit) per sample, the variants alternating
        # step by step so that bursts of load from other processes hit them alike.
        def step_then(setup, commit):
            def one_step():
                setup.step()
                commit()
            return one_step

        results.update(self.timed({
            "loop": step_then(self.plain, lambda: None),
            "ours.loop": step_then(self.mine, ours.commit),
            "torchstate.loop": step_then(self.other, theirs.commit),
        }, reps=self.args.steps))

        def ratio(a: str, b: str) -> dict[str, float]:
            return {k: results[a][k] / results[b][k] for k in ("median", "best")}

        return {
            "world_size": hvd.size(),
            "parameters": params,
            "state_bytes": nbytes,
            "torch_threads": torch.get_num_threads(),
            "batch": self.args.batch,
            "seconds": results,
            "load_average": os.getloadavg(),
            "ratios": {
                "ours.save/copy_": ratio("ours.save", "copy_"),
                "ours.commit/copy_": ratio("ours.commit", "copy_"),
                "torchstate.save/copy_": ratio("torchstate.save", "copy_"),
                "torchstate.commit/copy_": ratio("torchstate.commit", "copy_"),
                "ours.sync/broadcast_": ratio("ours.sync", "broadcast_"),
                "torchstate.sync/broadcast_": ratio("torchstate.sync", "broadcast_"),
                "ours.loop/loop": ratio("ours.loop", "loop"),
                "torchstate.loop/loop": ratio("torchstate.loop", "loop"),
            },
            "targets": {"ours.save/copy_": 1.2, "ours.sync/broadcast_": 1.3, "ours.loop/loop": 1.03},
            "seconds_note": "per operation (per step for loops), slowest rank; median and best over rounds",
        }


def table(report: dict) -> str:
    s, r = report["seconds"], report["ratios"]
    rows = [
        ("commit (host copy)", "copy_", "ours.save", "torchstate.save", "<= 1.2x"),
        ("commit (+host check)", "copy_", "ours.commit", "torchstate.commit", ""),
        (f"sync, {report['world_size']} workers", "broadcast_", "ours.sync", "torchstate.sync", "<= 1.3x"),
        ("train step + commit", "loop", "ours.loop", "torchstate.loop", "<= 1.03x"),
    ]
    head = (f"{report['parameters'] / 1e6:.1f}M-parameter MLP + Adam, {report['state_bytes'] / 2**20:.0f} MiB of state, "
            f"{report['world_size']} Gloo workers, batch {report['batch']}, {report['torch_threads']} torch thread(s), "
            f"load average {report['load_average'][0]:.1f}; seconds are medians (best) of interleaved rounds")
    lines = [head, f"{'measure':22} {'baseline':>10} {'base s':>15} {'ours s':>15} {'ours x':>13} "
                   f"{'TorchState s':>15} {'TS x':>13}  target"]

    def cell(name: str) -> str:
        return f"{s[name]['median']:.3f} ({s[name]['best']:.3f})"

    def times(a: str, b: str) -> str:
        x = r[f"{a}/{b}"]
        return f"{x['median']:.2f}x ({x['best']:.2f}x)"

    for label, base, ours, theirs, target in rows:
        base_name = "no library" if base == "loop" else base
        lines.append(f"{label:22} {base_name:>10} {cell(base):>15} {cell(ours):>15} {times(ours, base):>13} "
                     f"{cell(theirs):>15} {times(theirs, base):>13}  {target}")
    lines.append(f"ours.sync: bucket broadcasts with their overlapped copies {cell('ours.sync.broadcast')} s; "
                 f"the rest is the header broadcast_object and loading small state")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if "HOROVOD_RANK" not in os.environ:
        return launch(args)
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(args.threads)
    hvd.init()
    report = Bench(args).run()
    if hvd.rank() == 0:
        print(table(report), flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
