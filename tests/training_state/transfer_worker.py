"""4-rank worker for test_transfer.py: syncs after which only some ranks need the state.

Every scenario builds the same model on every rank (same seed), trains it in
lockstep (allreduced gradients, so parameters and moments stay equal), commits,
then changes some ranks the way resets do and calls ``sync()``:

* ``joiner``: rank 3 is brand new (its own seed, no optimizer state);
* ``two_joiners``: ranks 2 and 3 are brand new; each rank trained on batches
  of its own, so rank 1's BatchNorm statistics drifted from rank 0's;
* ``behind``: rank 2 holds the commit before its peers' last one (a failure
  between their commits; loaded from a snapshot, so a lineage of its own),
  rank 3 is brand new; statistics drifted too;
* ``diverged``: rank 3 is brand new, and rank 1's parameters moved before a
  save all ranks made in lockstep (its lineage is rank 0's, its bytes are
  not): its first-round stripes to rank 3 are wrong;
* ``newcomers``: ranks 1 to 3 are brand new (a world regrown around its one
  survivor): nobody shares rank 0's lineage;
* ``restored``: a failure everyone restored from: nobody needs anything;
* ``fresh``: rank 0 changed one live tensor after its commit: it copies its
  live tensors, and the digests show every other rank the one that moved.

The tensors carry -0.0, a NaN with a payload, int64 and bool buffers.  Each
rank writes ``$OUT/<scenario>-<rank>.json``: a digest of every tensor's bytes,
the sync event's fields, and what a restore() after the sync comes back to.
"""

import hashlib
import json
import os

import torch

import horovod.torch as hvd
from hvd_elastic.training._internal import transfer
from hvd_elastic.training.state import TrainingState

OUT = os.environ["OUT"]


#: The ranks each scenario replaces with a brand-new model before its sync.
BRAND_NEW = {"joiner": {3}, "two_joiners": {2, 3}, "behind": {3}, "diverged": {3}, "newcomers": {1, 2, 3}}


def build(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.BatchNorm1d(256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.Linear(256, 4))
    special = torch.tensor([-0.0, 0.0, 1.0])
    special.view(torch.int32)[1] = 0x7FC00123 + seed  # a NaN with a payload
    model.register_buffer("special", special)
    model.register_buffer("counts", torch.arange(7, dtype=torch.int64) + seed)
    model.register_buffer("mask", torch.tensor([True, False, bool(seed % 2)]))
    base = torch.optim.Adam(model.parameters(), lr=0.01)
    optimizer = hvd.DistributedOptimizer(base, named_parameters=[(f"s{seed}.{n}", p) for n, p in
                                                                 model.named_parameters()])
    # 4 KiB buckets: several units per dtype, so stripes and runs are cut
    state = TrainingState(model=model, optimizer=optimizer, rng=False, bucket_bytes=4096, step=0)
    return model, optimizer, state


def train(model, optimizer, state, steps: int, same_data: bool) -> None:
    """Lockstep steps; with ``same_data`` False each rank's BatchNorm statistics drift apart."""
    for _ in range(steps):
        optimizer.zero_grad()
        seed = state.step if same_data else 100 * hvd.rank() + state.step
        model(torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))).square().sum().backward()
        optimizer.step()
        if same_data:
            # Lockstep steps on the same batches keep the ranks equal only up to the last bit
            # (under CPU load one rank's first Adam step left a weight a few ulps apart): these
            # scenarios need them bitwise equal, so they take rank 0's tensors.  copy_() bumps
            # the version counters that sync relies on.
            for t in filter(torch.is_floating_point, state._live_tensors()):
                t.copy_(hvd.broadcast(t, 0))
        state.commit_step()


def fingerprint(state) -> dict:
    tensors = dict(state._capture()[0])
    return {k: hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
            for k, t in tensors.items()}


def scenario(name: str, seed_base: int) -> None:
    rank = hvd.rank()
    same_data = name in ("joiner", "diverged", "restored", "fresh")
    model, optimizer, state = build(seed_base)
    state.sync()  # as hvd.elastic.run does first: from here the ranks share a lineage
    train(model, optimizer, state, 1, same_data)
    one_behind = state.snapshot(copy=True)
    train(model, optimizer, state, 1, same_data)
    if rank in BRAND_NEW.get(name, ()):
        model, optimizer, state = build(seed_base + 1 + rank)  # brand new, never stepped
    if name == "behind" and rank == 2:
        # Its peers' last commit went through, its own did not: it holds the one before.
        state.load_snapshot(one_behind)
    if name == "diverged" and rank < 3:
        if rank == 1:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.5)
        state.save()  # in lockstep: the lineages stay equal
    if name == "restored":
        with torch.no_grad():
            model[3].weight.add_(1.0)  # a half-done step, as a failure leaves it
        state.restore()
    if name == "fresh":
        if rank == 0:
            with torch.no_grad():
                model[4].bias.add_(0.25)
        state.check_host_updates()  # collective; standalone, so the live tensors may have moved on
    events = []
    state.add_listener(lambda event, fields: events.append(fields) if event == "sync" else None)
    state.sync()
    after = fingerprint(state)
    with torch.no_grad():
        model[3].weight.add_(3.0)
    state.restore()
    with open(os.path.join(OUT, f"{name}-{rank}.json"), "w") as f:
        json.dump({"tensors": after, "restored": fingerprint(state), "sync": events[0],
                   "state_bytes": state._buffer.layout.nbytes, "parameter_bytes": sum(
                       p.numel() * p.element_size() for p in model.parameters()),
                   "moments": sorted(optimizer.state[model[0].weight])}, f)


def main() -> None:
    hvd.init()
    # Relayed units cut into several uneven pieces, as a real state's are at 16 MiB.
    transfer.RELAY_PIECE_BYTES = 10_000
    assert hvd.size() == 4
    for i, name in enumerate(("joiner", "two_joiners", "behind", "diverged", "newcomers", "restored", "fresh")):
        scenario(name, 10 * i)


if __name__ == "__main__":
    main()
