"""examples/torch_digits.py's training, started by mpirun, with mpi4py collectives interleaved
with kolo's: every gradient is also reduced by mpi4py while kolo's reduction is in flight, and
the two must agree bit for bit. Prints the same checksum line as the example."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import torch_digits as example

import kolo.torch as hvd

comm = MPI.COMM_WORLD


def mpi_average(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise average over the ranks, by mpi4py."""
    total = np.empty_like(tensor.numpy())
    comm.Allreduce(tensor.numpy(), total, op=MPI.SUM)
    return torch.from_numpy(total) / comm.Get_size()


def main() -> None:
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (comm.Get_rank(), comm.Get_size()), "rank mismatch"
    settings = comm.bcast({"epochs": example.EPOCHS} if comm.Get_rank() == 0 else None)
    torch.manual_seed(hvd.rank())
    x_train, y_train, _, _ = example.load_shard()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    for index, param in enumerate(model.parameters()):
        hvd.broadcast_(param.data, root_rank=0, name=f"init.{index}")
        mine = param.data.numpy().copy()
        comm.Bcast(mine, root=0)  # mpi4py sees what kolo broadcast
        assert np.array_equal(mine, param.data.numpy()), "broadcasts disagree"
    optimizer = torch.optim.SGD(
        model.parameters(), lr=example.LEARNING_RATE * hvd.size(), momentum=0.9
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    local_steps = torch.tensor([len(x_train) // example.BATCH_SIZE])
    steps = int(hvd.allreduce(local_steps, op=hvd.Min, name="steps").item())
    assert steps == comm.allreduce(int(local_steps.item()), op=MPI.MIN)
    generator = torch.Generator().manual_seed(1234 + hvd.rank())
    agreed = 0
    for _ in range(settings["epochs"]):
        order = torch.randperm(len(x_train), generator=generator)
        epoch_loss = torch.zeros(1)
        for step in range(steps):
            batch = order[step * example.BATCH_SIZE : (step + 1) * example.BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            params = list(model.parameters())
            handles = [
                hvd.allreduce_async(p.grad, op=hvd.Average, name=f"grad.{i}")
                for i, p in enumerate(params)
            ]
            by_mpi = [mpi_average(p.grad) for p in params]  # while kolo's are in flight
            for param, handle, expected in zip(params, handles, by_mpi):
                param.grad = hvd.synchronize(handle)
                assert torch.equal(param.grad, expected), "kolo and mpi4py reductions differ"
                agreed += 1
            optimizer.step()
            epoch_loss += loss.detach()
        comm.Barrier()
        hvd.allreduce(epoch_loss / steps, name="epoch_loss")
    checksum = example.parameter_checksum(model)
    print(f"rank {hvd.rank()}: parameter checksum {checksum}", flush=True)
    assert comm.allgather(checksum) == hvd.allgather_object(checksum, name="checksums")
    print(f"rank {hvd.rank()}: mpi4py and kolo agreed on {agreed} reductions", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
