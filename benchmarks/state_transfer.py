"""A joiner's state transfer on bandwidth-limited hosts: hvd-elastic's sync against Horovod's.

On the multi-host bed (network namespaces, real ssh, one rank per host), every
host's link is limited with a ``tc`` token bucket (``tbf``) in both
directions: egress on the host's ``eth0``, and egress of its bridge port,
which is the host's inbound line.  The job holds a ~290 MiB state (a 25M
parameter MLP and Adam's moments); the last rank plays the joiner (its
committed tensors differ from everyone's), the others are survivors that hold
rank 0's committed state.  Interleaved round by round, in the same processes:

* ``sync``: hvd-elastic's ``TrainingState.sync()`` (digests, then the
  survivors' stripes to the joiner);
* ``horovod``: ``hvd.broadcast_parameters`` + ``hvd.broadcast_optimizer_state``,
  what Horovod's ``TorchState.sync`` does;
* ``start``: the same sync where only rank 0 holds the state (a job's start
  or resume: rank 0 is the one donor);
* ``start: scatter`` and ``start: exchange``: the two halves of the start's
  relay, each alone in the relay's pieces (whole ones): rank 0's stripes
  to the receivers (links loaded one way), the receivers' stripes to each
  other (every receiver's link loaded both ways, (N-2)/(N-1) of S each way);
  and those same exchanged bytes over plain TCP sockets, a thread per peer
  and no Gloo: the floor of such traffic on this bed;
* ``flat broadcast``: one ``hvd.broadcast_`` of a flat tensor of the same bytes
  (hvd-elastic's sync before this change sent its buffer that way, in buckets).

Each is reported against S/B (the joiner's inbound line rate: state bytes over
the token-bucket rate).  Goal: sync <= 1.25 x S/B at 4 ranks, and not growing
with the number of ranks.

    sudo .venv/bin/python benchmarks/state_transfer.py [--ranks 4,8] [--rate-mbit 1000] [--rounds 3]

Needs root (the bed).  Writes ``benchmarks/results/state_transfer.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: testbed/ is not installed
from report import RESULTS, Row, format_table, load_note, spread, write_json  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = RESULTS / "state_transfer.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="4,8", help="comma-separated job sizes, one host per rank (default 4,8)")
    p.add_argument("--rate-mbit", type=int, default=1000, help="token-bucket rate of every host's link, Mbit/s")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per job size")
    p.add_argument("--width", type=int, default=4096, help="hidden width of the MLP (4096: ~290 MiB of state)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)  # set on the workers
    return p.parse_args(argv)


# -- the bed (root, on the machine) --------------------------------------------------------------


def limit(bed, host, rate_mbit: int) -> None:
    """Token buckets on both directions of ``host``'s link."""
    # A burst of a few ms at the rate (at least 64 KiB), as tbf needs rate/HZ at the least.
    burst = max(64 * 1024, rate_mbit * 1_000_000 // 8 // 250)
    shape = ["root", "tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]
    out = bed.run(host, ["tc", "qdisc", "replace", "dev", "eth0", *shape])
    if out.returncode != 0:
        raise RuntimeError(f"tc on {host.name}'s eth0: {out.stderr.strip()}")
    subprocess.run(["tc", "qdisc", "replace", "dev", host.link, *shape], check=True, capture_output=True)


def run_size(ranks: int, args: argparse.Namespace, workdir: Path) -> dict:
    from hvd_elastic.local.env import VENV_BIN
    from testbed.env import child_env
    from testbed.netns import LAUNCHER, NetnsBed

    out = workdir / f"np{ranks}"
    out.mkdir()
    with NetnsBed(workdir / f"bed{ranks}", hosts=ranks) as bed:
        hosts = list(bed.hosts.values())
        for host in hosts:
            limit(bed, host, args.rate_mbit)
        cmd = [VENV_BIN / "horovodrun", "--gloo", "-np", str(ranks), "--network-interface", "eth0",
               "-H", ",".join(f"{h.name}:1" for h in hosts), VENV_BIN / "python", Path(__file__).resolve(),
               "--worker-out", out, "--rounds", str(args.rounds), "--width", str(args.width),
               "--rate-mbit", str(args.rate_mbit)]
        env = bed.env(child_env(PYTHONPATH=str(REPO), HOROVOD_GLOO_TIMEOUT_SECONDS="300"))
        with open(out / "horovodrun.log", "w") as log:
            code = subprocess.run(bed.on(LAUNCHER, cmd), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=1800).returncode
        if code != 0:
            raise RuntimeError(f"the {ranks}-rank job exited with {code}; see {out / 'horovodrun.log'}")
    return json.loads((out / "result.json").read_text())


def main_bed(args: argparse.Namespace) -> int:
    from testbed.netns import unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"state_transfer: {reason}", file=sys.stderr)
        return 2
    load_at_start = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="hvd-state-transfer-") as tmp:
        for ranks in (int(n) for n in args.ranks.split(",")):
            results.append(run_size(ranks, args, Path(tmp)))
    rows = []
    for res in results:
        line = res["line_seconds"]
        n = res["ranks"]
        for key, label in (("sync", "hvd-elastic sync"), ("sync: transfer", "  of which the transfer"),
                           ("start", "sync, only rank 0 holds it (start)"),
                           ("start: scatter", "  its relay's scatter alone (one way)"),
                           ("start: exchange", f"  its relay's exchange alone (both ways; {n - 2}/{n - 1} S)"),
                           ("start: exchange, TCP", "  the same bytes over plain TCP sockets (the bed's floor)"),
                           ("horovod", "Horovod broadcast_parameters+optimizer"), ("flat", "one flat broadcast_")):
            samples = res["samples_s"].get(key)
            if samples is None:
                continue
            rows.append(Row(f"{n} ranks: {label}", spread(samples), baseline=f"S/B = {line:.2f} s",
                            ratio=spread([s / line for s in samples]),
                            target=1.25 if key == "sync" and n == 4 else None))
    mib = results[0]["state_bytes"] / 2**20
    print(format_table(f"{mib:.0f} MiB of state, 1 joiner, tbf {args.rate_mbit} Mbit/s on every host's link "
                       f"both ways, one rank per netns host, {load_note(load_at_start)}; slowest rank per sample",
                       rows), flush=True)
    print(f"wrote {write_json(args.json, {'rate_mbit': args.rate_mbit, 'rows': rows, 'jobs': results})}")
    return 0


# -- the workers (under horovodrun, one per host) ------------------------------------------------


def main_worker(args: argparse.Namespace) -> int:
    import torch
    import horovod.torch as hvd
    from state_bench import Setup

    from hvd_elastic.training._internal import transfer
    from hvd_elastic.training.state import TrainingState

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    setup = Setup(argparse.Namespace(width=args.width, batch=64))
    tensors = setup.tensors()
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    state = TrainingState(model=setup.model, optimizer=setup.optimizer, rng=False, epoch=0)
    state.sync()  # as run() does first: from here every rank descends from rank 0's state
    state.commit()
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    events: list[dict] = []
    state.add_listener(lambda event, fields: events.append(fields) if event == "sync" else None)

    def joiner_lacks_the_state():
        state.restore()
        if rank == size - 1:
            with torch.no_grad():
                for t in tensors:
                    t.add_(1)
            state.save()

    def horovod():
        hvd.broadcast_parameters(setup.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(setup.optimizer, root_rank=0)

    def only_rank_0_holds_it():
        # A job's start or resume: no rank shares rank 0's lineage, rank 0 is the one donor.
        state.restore()
        if rank != 0:
            with torch.no_grad():
                for t in tensors:
                    t.add_(1)
            state.save()

    # The relay's halves move the state in whole pieces (the last one rounded up): the same steps.
    pieces = -(-nbytes // transfer.RELAY_PIECE_BYTES)
    stripe = transfer.RELAY_PIECE_BYTES // (size - 1)

    def relay_half(half: str):
        """One half of the start's relay alone, in the relay's pieces: rank 0's stripes to the
        receivers (its outbound link, one way), or the receivers passing their stripes to each
        other (every receiver's link both ways at once)."""
        for step in range(pieces):
            splits = [0] * size
            if half == "scatter" and rank == 0:
                splits[1:] = [stripe] * (size - 1)
            elif half == "exchange" and rank != 0:
                splits[1:] = [stripe if k != rank else 0 for k in range(1, size)]
            hvd.alltoall(flat[: sum(splits)], splits=splits, name=f"bench.{half}.{step}")

    addresses = hvd.allgather_object(socket.gethostbyname(socket.gethostname()), name="bench.addresses")

    def tcp_exchange(port: int = 29531):
        """The exchange's bytes over plain TCP sockets, a thread per peer, no Gloo: what this
        bed's links do both ways at once, the floor of the exchange here."""
        share = pieces * stripe
        peers = [a for k, a in enumerate(addresses) if k not in (0, rank)] if rank != 0 else []
        listener = socket.create_server((addresses[rank], port)) if peers else None
        hvd.allreduce(torch.zeros(1), name="bench.tcp.listening")
        failures: list[BaseException] = []

        def send(address):
            with socket.create_connection((address, port)) as conn:
                conn.sendall(memoryview(flat.numpy())[:share])

        def receive():
            conn, _ = listener.accept()
            with conn:
                view, left = memoryview(bytearray(1 << 20)), share
                while left:
                    got = conn.recv_into(view, min(left, len(view)))
                    if not got:
                        raise ConnectionError(f"a peer closed with {left} bytes to come")
                    left -= got

        def guarded(work, *args):
            try:
                work(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
                failures.append(exc)

        threads = [threading.Thread(target=guarded, args=(send, p)) for p in peers]
        threads += [threading.Thread(target=guarded, args=(receive,)) for _ in peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if listener is not None:
            listener.close()
        if failures:
            raise failures[0]

    variants = {"sync": (joiner_lacks_the_state, state.sync), "start": (only_rank_0_holds_it, state.sync),
                "start: scatter": (None, lambda: relay_half("scatter")),
                "start: exchange": (None, lambda: relay_half("exchange")),
                "start: exchange, TCP": (None, tcp_exchange),
                "horovod": (None, horovod),
                "flat": (None, lambda: hvd.broadcast_(flat, 0, name="bench.flat"))}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (prepare, fn) in variants.items():
            if prepare is not None:
                prepare()
            hvd.allreduce(torch.zeros(1), name="bench.barrier")
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    # The sync's transfer alone (its wire time, with the copies it overlaps): the rest is the
    # header, the digests and the unpacking after the last unit.
    times["sync: transfer"] = [e["broadcast_seconds"] for e in events[0::2]]
    slowest = {name: hvd.allreduce(torch.tensor(t, dtype=torch.float64), op=hvd.Max, name=f"bench.max.{name}")
               .tolist() for name, t in times.items()}
    if rank == 0:
        result = {"ranks": size, "state_bytes": nbytes, "rate_mbit": args.rate_mbit,
                  "line_seconds": nbytes * 8 / (args.rate_mbit * 1e6), "samples_s": slowest,
                  "sync_transfer": sorted({e["transfer"] for e in events[0::2]}),
                  "start_transfer": sorted({e["transfer"] for e in events[1::2]}),
                  "rank0_sent_bytes": [e["sent_bytes"] for e in events[0::2]]}
        (args.worker_out / "result.json").write_text(json.dumps(result))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker_out is not None:
        return main_worker(args)
    return main_bed(args)


if __name__ == "__main__":
    sys.exit(main())
