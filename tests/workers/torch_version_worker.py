"""Trains a small model with kolo.torch.DistributedOptimizer on every rank and prints, on rank
0, one ``RESULT {json}`` line: the torch version, the path of the kolo native module it used,
and the trained weights. tests/test_torch_versions.py runs it under ``kolorun -np 2`` with two
torch versions and compares.

Weights and data come from numpy (not torch's RNG), so only the training math is compared.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

import kolo
import kolo._native
import kolo.torch as hvd

STEPS = 20
ROWS = 8  # per rank and step


def main() -> None:
    hvd.init()
    torch.set_default_dtype(torch.float64)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    init = np.random.RandomState(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(init.uniform(-0.5, 0.5, size=tuple(p.shape))))
            if hvd.rank() != 0:
                p.add_(1.0)  # broadcast_parameters must undo this
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    data = np.random.RandomState(11)
    x = torch.from_numpy(data.normal(size=(STEPS, hvd.size() * ROWS, 8)))
    y = torch.from_numpy(data.normal(size=(STEPS, hvd.size() * ROWS, 4)))
    mine = slice(hvd.rank() * ROWS, (hvd.rank() + 1) * ROWS)
    for step in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[step, mine]), y[step, mine]).backward()
        opt.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(weights.unsqueeze(0))
    assert torch.equal(gathered[0], gathered[-1]), "ranks disagree"
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    assert float(total) == hvd.size() * (hvd.size() + 1) / 2
    if hvd.rank() == 0:
        result = {
            "torch": torch.__version__,
            "native": os.path.realpath(kolo._native.__file__),
            "kolo": kolo.__version__,
            "weights": weights.tolist(),
        }
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
