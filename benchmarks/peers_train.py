"""The one training job of benchmarks/peers.py, written for each stack the way its own docs show.

``python benchmarks/peers_train.py --stack STACK --out DIR`` under that stack's
launcher.  Same model, data, optimizer, learning rate and global batch for all
four; what differs is only what each stack asks of its users:

``hvd-elastic``
    ``TrainingState`` + ``ExactlyOnceSampler`` + ``@hvd_elastic.run`` with
    checkpoints (examples/train_elastic.py), a constant global batch.
``horovod``
    ``hvd.elastic.TorchState`` + ``ElasticSampler`` + ``@hvd.elastic.run``
    (Horovod's elastic PyTorch example); the per-rank batch is re-chosen for
    the world size at every reset, so the global batch stays constant.
``torchrun``
    ``init_process_group`` + DDP, a checkpoint (model, optimizer, position in
    the epoch) every ``--checkpoint-every`` steps, resumed at every restart
    (torchrun's docs); the rest of an epoch is split over the new world.
``torchft``
    torchft's ``Manager`` over ``ProcessGroupGloo``, its DDP and optimizer
    wrappers, ``PGTransport`` healing (its ``train_ddp.py``); each replica
    group trains its own shard (torchft's ``DistributedSampler``), so the
    global batch is the per-group batch times the groups taking part.

Every rank writes the ledger of :mod:`peers_ledger` (a row per step it trained,
before the stack's commit: the chain walk tells the kept ones) and rank 0
``final.json`` (final chain, loss and held-out accuracy).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers_ledger import Writer, link  # noqa: E402  (a script run from anywhere on every host)

STACKS = ("hvd-elastic", "horovod", "torchrun", "torchft")
FEATURES, CLASSES, HIDDEN = 32, 8, 128
TEST_SAMPLES = 1024
LR, MOMENTUM = 0.05, 0.9


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", choices=STACKS, required=True)
    parser.add_argument("--out", required=True, help="shared run directory (ledger, checkpoints, final.json)")
    parser.add_argument("--samples", type=int, default=6144, help="training set size")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=48, help="samples per step (divisible by 1-4)")
    parser.add_argument("--groups", type=int, default=4, help="torchft: replica groups (the shards)")
    parser.add_argument("--step-time", type=float, default=0.1,
                        help="seconds of stand-in compute for a rank's share of a step at full size "
                             "(global batch / --full-world samples); a rank's compute is proportional to its samples")
    parser.add_argument("--full-world", type=int, default=4, help="ranks (hosts) at full size")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between durable checkpoints")
    return parser.parse_args(argv)


def data(samples: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fixed classification task (a random teacher, label noise): train x, y and held-out x, y."""
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    x = torch.randn(samples + TEST_SAMPLES, FEATURES, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(samples + TEST_SAMPLES, CLASSES, generator=g)).argmax(1)
    return x[:samples], y[:samples], x[samples:], y[samples:]


def model() -> torch.nn.Module:
    torch.manual_seed(1)  # the same start on every rank and stack
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def compute(args: argparse.Namespace, samples: int) -> None:
    """Stand-in for a real step's compute on ``samples`` samples: sleeps, so 4 hosts on 2 cores measure the
    stacks, not the box.  In proportion to the samples, as a real forward and backward pass: a rank of a
    shrunken world with a constant global batch takes longer per step, an idle rank takes no time."""
    time.sleep(args.step_time * samples * args.full_world / args.global_batch)


def evaluate(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        logits = net(x)
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def write_final(out: str, stack: str, chain: int, step: int, net: torch.nn.Module, test) -> None:
    import json

    loss, accuracy = evaluate(net, *test)
    tmp = os.path.join(out, f"final.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"stack": stack, "chain": chain, "step": step, "test_loss": loss, "test_accuracy": accuracy,
                   "time": time.time()}, f)
    os.replace(tmp, os.path.join(out, "final.json"))


def host() -> str:
    return os.environ.get("HOROVOD_HOSTNAME") or os.environ.get("PEERS_HOST") or socket.gethostname()


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    run = {"hvd-elastic": run_hvd_elastic, "horovod": run_horovod, "torchrun": run_torchrun,
           "torchft": run_torchft}[args.stack]
    run(args, *data(args.samples))


# -- Horovod's two ways ---------------------------------------------------------------------------------------


def record(ledger: Writer, state, token: int, size: int, rank: int, samples: list[int], loss: float) -> None:
    """Advance ``state.chain`` to the step being committed and write its row.

    Called before the commit, which may raise HostsUpdatedInterrupt after saving the step; a row whose
    step is rolled back instead is simply off the final chain.
    """
    parent, state.chain = state.chain, link(state.chain, token, state.step + 1)
    ledger.step(time.time(), state.step + 1, state.chain, parent, state.epoch, size, rank, samples, loss)


def run_hvd_elastic(args, x, y, test_x, test_y) -> None:
    import horovod.torch as hvd

    from torch.utils.data import DataLoader, TensorDataset

    import hvd_elastic
    from hvd_elastic import BatchPolicy, ExactlyOnceSampler, TrainingState

    hvd.init()
    net = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM),
                                         named_parameters=net.named_parameters(), op=hvd.Sum)
    sampler = ExactlyOnceSampler(len(x), seed=7)
    state = TrainingState(model=net, optimizer=optimizer, sampler=sampler, epoch=0, step=0, chain=0,
                          batch_policy=BatchPolicy.constant_global(args.global_batch))
    ledger = Writer(args.out, host(), args.stack)

    loader = DataLoader(TensorDataset(torch.arange(len(x))), batch_sampler=sampler,
                        collate_fn=ExactlyOnceSampler.collate())

    # The event log as the examples keep it: each reset's phases, for the pauses' breakdown.
    @hvd_elastic.run(checkpoint_dir=os.path.join(args.out, "ckpt"), checkpoint_every_commits=args.checkpoint_every,
                     event_log=os.path.join(args.out, "events.jsonl"))
    def train(state) -> None:
        token = hvd.broadcast_object(random.getrandbits(48), root_rank=0, name="peers.token")
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for batch in loader:
                indices = batch[0] if batch is not None else torch.zeros(0, dtype=torch.long)
                optimizer.zero_grad()
                loss = F.cross_entropy(net(x[indices]), y[indices], reduction="sum") / sampler.samples_this_step
                loss.backward()  # an idle rank (None batch) still joins the allreduce, with zero gradients
                compute(args, len(indices))
                optimizer.step()
                mean = hvd.allreduce(loss.detach(), op=hvd.Sum, name="peers.loss").item()
                record(ledger, state, token, hvd.size(), hvd.rank(), indices.tolist(), mean)
                state.commit_step()
            state.epoch += 1
            state.commit()

    train(state)
    if hvd.rank() == 0:
        write_final(args.out, args.stack, state.chain, state.step, net, (test_x, test_y))


def run_horovod(args, x, y, test_x, test_y) -> None:
    import horovod.torch as hvd
    from horovod.torch.elastic import ElasticSampler
    from torch.utils.data import DataLoader, TensorDataset

    hvd.init()
    net = model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM),
                                         named_parameters=net.named_parameters())
    dataset = TensorDataset(torch.arange(len(x)))
    sampler = ElasticSampler(dataset, shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model=net, optimizer=optimizer, sampler=sampler, epoch=0, step=0, chain=0)
    ledger = Writer(args.out, host(), args.stack)

    @hvd.elastic.run
    def train(state) -> None:
        token = hvd.broadcast_object(random.getrandbits(48), root_rank=0, name="peers.token")
        batch_size = args.global_batch // hvd.size()  # hvd.Average over equal batches: the global mean
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
            for i, (batch,) in enumerate(loader):
                optimizer.zero_grad()
                loss = F.cross_entropy(net(x[batch]), y[batch])
                loss.backward()
                compute(args, len(batch))
                optimizer.step()
                mean = hvd.allreduce(loss.detach(), name="peers.loss").item()
                sampler.record_batch(i, batch_size)
                record(ledger, state, token, hvd.size(), hvd.rank(), batch.tolist(), mean)
                state.step += 1
                state.commit()
            state.epoch += 1
            state.commit()

    train(state)
    if hvd.rank() == 0:
        write_final(args.out, args.stack, state.chain, state.step, net, (test_x, test_y))


# -- torchrun -------------------------------------------------------------------------------------------------


def run_torchrun(args, x, y, test_x, test_y) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    net = model()
    ddp = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    ckpt = os.path.join(args.out, "ckpt.pt")
    state = {"epoch": 0, "position": 0, "step": 0, "chain": 0}
    if os.path.exists(ckpt):  # torchrun restarted us: resume (the file is our own: plain tensors and numbers)
        saved = torch.load(ckpt, weights_only=True)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state = {k: int(saved[k]) for k in state}
    token = [random.getrandbits(48)]
    dist.broadcast_object_list(token, src=0)
    ledger = Writer(args.out, host(), args.stack)
    per_rank = args.global_batch // size
    while state["epoch"] < args.epochs:
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(7 + state["epoch"]))
        while state["position"] < len(x):
            step_samples = order[state["position"]:state["position"] + args.global_batch]
            batch = step_samples[rank * per_rank:(rank + 1) * per_rank]
            optimizer.zero_grad()
            # DDP averages over ranks: scaled so the update is the mean over the step's samples.
            loss = F.cross_entropy(ddp(x[batch]), y[batch], reduction="sum") * size / len(step_samples)
            loss.backward()  # an idle rank (no sample left) still joins the allreduce, with zero gradients
            compute(args, len(batch))
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            state["position"] += len(step_samples)
            parent, state["chain"] = state["chain"], link(state["chain"], token[0], state["step"] + 1)
            state["step"] += 1
            ledger.step(time.time(), state["step"], state["chain"], parent, state["epoch"], size, rank,
                        batch.tolist(), mean.item() / size)
            if rank == 0 and state["step"] % args.checkpoint_every == 0:
                _save(ckpt, net, optimizer, state)
        state["epoch"] += 1
        state["position"] = 0
    if rank == 0:
        _save(ckpt, net, optimizer, state)
        write_final(args.out, args.stack, state["chain"], state["step"], net, (test_x, test_y))
    dist.barrier()  # no rank tears its connections down while rank 0 still writes
    dist.destroy_process_group()


def _save(path: str, net, optimizer, state: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), **state}, tmp)
    os.replace(tmp, path)


# -- torchft --------------------------------------------------------------------------------------------------


def run_torchft(args, x, y, test_x, test_y) -> None:
    from datetime import timedelta

    from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    group = int(os.environ["REPLICA_GROUP_ID"])
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    extra = {"chain": 0, "launch": int(os.environ.get("PEERS_LAUNCH", "0"))}

    def state_dict():
        return {"model": net.state_dict(), "optim": inner.state_dict(), "chain": extra["chain"]}

    def load_state_dict(saved):
        net.load_state_dict(saved["model"])
        inner.load_state_dict(saved["optim"])
        extra["chain"] = int(saved["chain"])

    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))  # train_ddp.py's choice
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"peers_{group}", timeout=timedelta(seconds=30),
                      hostname=os.environ.get("PEERS_ADDR", socket.gethostname()),
                      checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device("cpu")))
    ddp = DistributedDataParallel(manager, net)
    optimizer = Optimizer(manager, inner)
    per_group = args.global_batch // args.groups
    total_steps = args.epochs * len(x) // args.global_batch  # an uninterrupted run of every group
    ledger = Writer(args.out, host(), args.stack)
    dataset = torch.utils.data.TensorDataset(torch.arange(len(x)))
    # A fixed number of shards, one per replica group (torchft's data model); a group beyond them repeats one.
    sampler = DistributedSampler(dataset, replica_rank=group % args.groups, num_replica_groups=args.groups,
                                 group_rank=0, num_replicas=1, shuffle=True, seed=7)
    epoch = 0
    while manager.current_step() < total_steps:
        sampler.set_epoch(epoch)
        for (batch,) in torch.utils.data.DataLoader(dataset, batch_size=per_group, sampler=sampler):
            if manager.current_step() >= total_steps:
                break
            before = manager.current_step()
            optimizer.zero_grad()  # torchft: starts this step's quorum
            loss = F.cross_entropy(ddp(x[batch]), y[batch])
            loss.backward()
            compute(args, len(batch))
            optimizer.step()  # applied only when every group of the quorum commits
            if manager.current_step() > before:
                parent = extra["chain"]
                extra["chain"] = link(parent, extra["launch"], manager.current_step())
                ledger.step(time.time(), manager.current_step(), extra["chain"], parent, epoch,
                            manager.num_participants(), group, batch.tolist(), loss.item())
        epoch += 1
    if group == 0:
        write_final(args.out, args.stack, extra["chain"], manager.current_step(), net, (test_x, test_y))
    manager.shutdown()


if __name__ == "__main__":
    main()
