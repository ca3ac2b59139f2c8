"""A tiny model trained data-parallel for the multi-host tests; prints what rank 0 ends with.

``python multihost_worker.py train`` trains STEPS steps of SGD on this rank's rows of a
fixed data set (every rank runs the same number of steps, whatever the world size, over the
same global batch split evenly) and prints ``WEIGHTS <json>`` (rank 0) and ``PLACE <json>``
(every rank: rank, size, host, host hash, data-plane address).

``python multihost_worker.py loop`` runs allreduces until one fails, printing ``READY`` after
the first and ``FAILED <seconds since the last success> <ExceptionType>: <message>`` then.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch

import kolo.torch as hvd

GLOBAL_ROWS = 12  # divisible by 1, 2, 3 and 4 ranks
STEPS = 10
torch.set_default_dtype(torch.float64)


def fit() -> tuple[list, dict]:
    """Trains on this rank's rows; returns (the weights, where this rank ran)."""
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(STEPS, GLOBAL_ROWS, 4, generator=g)
    y = torch.randn(STEPS, GLOBAL_ROWS, 1, generator=g)
    per = GLOBAL_ROWS // hvd.size()
    rows = slice(hvd.rank() * per, (hvd.rank() + 1) * per)
    for step in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[step, rows]), y[step, rows])
        loss.backward()
        opt.step()
    place = dict(
        rank=hvd.rank(),
        size=hvd.size(),
        hostname=socket.gethostname(),
        kolo_hostname=os.environ.get("KOLO_HOSTNAME"),
        cross_rank=hvd.cross_rank(),
        cross_size=hvd.cross_size(),
    )
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    hvd.shutdown()
    return weights, place


def train() -> None:
    weights, place = fit()
    print("PLACE " + json.dumps(place), flush=True)
    if place["rank"] == 0:
        print("WEIGHTS " + json.dumps(weights), flush=True)


def loop() -> None:
    hvd.init()
    last = time.monotonic()
    tensor = torch.ones(1024)
    hvd.allreduce(tensor, name="warmup")
    print(f"READY {hvd.rank()}", flush=True)
    try:
        while True:
            hvd.allreduce(tensor, name="loop")
            last = time.monotonic()
            time.sleep(0.01)
    except Exception as err:
        elapsed = time.monotonic() - last
        message = str(err).replace("\n", " ")
        print(f"FAILED {hvd.rank()} {elapsed:.3f} {type(err).__name__}: {message}", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    {"train": train, "loop": loop}[sys.argv[1]]()
