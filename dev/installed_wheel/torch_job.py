"""The 2-rank ``kolo.torch`` job dev/test-installed-wheel.sh runs with the installed wheel
(``kolorun -np 2 python torch_job.py``): an Average allreduce, a broadcast of rank 0's initial
weights and three DistributedOptimizer steps on different data per rank; every rank must end
with the same weights, which must differ from where they started. Rank 0 prints ``RESULT ok``.
"""

from __future__ import annotations

import torch

import kolo.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert size == 2, size

mean = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Average, name="rank_mean")
assert mean.item() == (size - 1) / 2, mean

torch.manual_seed(rank)  # different initial weights: the broadcast must make them equal
model = torch.nn.Linear(4, 1)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
start = [p.detach().clone() for p in model.parameters()]
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
for step in range(3):
    x = torch.full((8, 4), float(rank + step + 1))
    optimizer.zero_grad()
    loss = ((model(x) - 1.0) ** 2).mean()
    loss.backward()
    optimizer.step()

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0), name="weights")
assert torch.equal(gathered[0], gathered[1]), gathered
assert not torch.equal(flat, torch.cat([p.reshape(-1) for p in start])), "weights never moved"
if rank == 0:
    print("RESULT ok", flush=True)
hvd.shutdown()
