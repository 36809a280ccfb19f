"""Static job worker: allreduce (sum) of rank+1; writes ``$SMOKE_DIR/result.<rank>.json``.

A file per rank, not stdout: mpirun may splice two ranks' output into one line.

Run under ``horovodrun --gloo`` or, with ``--mpi-comm``, under ``mpirun`` using
mpi4py's COMM_WORLD as Horovod's communicator.
"""

import argparse
import json
import os

import torch

import horovod.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mpi-comm", action="store_true", help="hvd.init(comm=MPI.COMM_WORLD)")
    args = parser.parse_args()
    if args.mpi_comm:
        from mpi4py import MPI

        hvd.init(comm=MPI.COMM_WORLD)
        mpi_size = MPI.COMM_WORLD.Get_size()
    else:
        hvd.init()
        mpi_size = None
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    result = {"rank": hvd.rank(), "size": hvd.size(), "mpi_size": mpi_size,
              "sum": total.item(), "mpi_built": hvd.mpi_built(), "gloo_built": hvd.gloo_built()}
    with open(os.path.join(os.environ["SMOKE_DIR"], f"result.{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
