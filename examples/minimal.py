"""The smallest correct elastic training script with hvd-elastic.

Launch it with horovodrun's elastic mode and Consul discovery::

    horovodrun -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script discovery/consul_hosts \\
        python examples/minimal.py --workdir /shared/run1

Everything that must survive a resize lives in one ``TrainingState``; the
``ExactlyOnceSampler`` trains each sample once per epoch across any resize; the
``@hvd_elastic.run`` decorator recovers from resets and resumes a restarted job
from ``<workdir>/ckpt``.  ``hvd-elastic report <workdir>`` shows its resets
(from ``<workdir>/events.jsonl``).  ``examples/train_elastic.py`` adds an LR
schedule, a constant global batch and a progress log.
"""

import argparse
import os

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader, TensorDataset

import hvd_elastic
from hvd_elastic import ExactlyOnceSampler, TrainingState


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="checkpoints and the event log go here (shared by all hosts)")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    hvd.init()
    generator = torch.Generator().manual_seed(0)  # the same data on every rank
    data = TensorDataset(torch.randn(1024, 8, generator=generator), torch.randn(1024, 1, generator=generator))
    model = torch.nn.Linear(8, 1)
    # op=hvd.Sum with each rank's loss divided by the step's GLOBAL sample count (below): every
    # sample weighs the same, however unevenly a step is split (hvd.Average would not).
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    sampler = ExactlyOnceSampler(data, batch_size=16, seed=0)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=ExactlyOnceSampler.collate())
    state = TrainingState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)

    @hvd_elastic.run(checkpoint_dir=os.path.join(args.workdir, "ckpt"), checkpoint_every_commits=20,
                     event_log=os.path.join(args.workdir, "events.jsonl"))
    def train(state: TrainingState) -> None:
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for batch in loader:
                optimizer.zero_grad()
                if batch is not None:  # None: this rank has no sample in the epoch's last step
                    x, y = batch
                    loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / sampler.samples_this_step
                    loss.backward()
                optimizer.step()  # also on an idle step: every rank joins the gradient allreduce
                state.commit_step()  # the step is done: sampler position, step count, commit
            state.epoch += 1
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print(f"training finished: epoch {state.epoch}, step {state.step}", flush=True)


if __name__ == "__main__":
    main()
