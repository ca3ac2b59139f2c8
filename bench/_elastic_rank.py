"""One rank of bench/elastic.py: an elastic training loop that prints when each phase of a
recovery ends, as ``event <name> <time.time()> <rank> <size>`` lines.

    python bench/_elastic_rank.py [--width 1000]     (started by bench/elastic.py)
    horovodrun --gloo ... python bench/_elastic_rank.py --horovod   (bench/peers/_horovod.py)

With ``--horovod`` the same loop runs on ``horovod.torch`` (in the Horovod venv), and each
event line also names this worker's slot as Horovod's driver does (``host[local_rank]`` from
``HOROVOD_HOSTNAME`` and ``HOROVOD_LOCAL_RANK``) and its pid, so the bench can tell the
workers apart and SIGKILL one.

The loop (``hvd.elastic.run`` around steps of a ``width`` x ``width`` linear model, about 1 M
parameters at the default, ``DistributedOptimizer`` + SGD, a ``TorchState`` commit after every
step) prints:

- ``up``: the process imported torch and kolo (a new rank);
- ``detected``: a collective raised ``HorovodInternalError`` (a rank died);
- ``interrupted``: a commit raised ``HostsUpdatedInterrupt`` (a host was added);
- ``reset``: ``shutdown()`` + ``init()`` returned (a reset callback; a new rank prints it
  after its first ``init()``);
- ``ready``: a new rank built its model, optimizer and state (just before the run loop);
- ``synced``: ``state.sync()`` returned (the decorated function starts);
- ``step``: the first step of a round completed (its gradients averaged and applied).

It runs until killed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import torch

HOROVOD = "--horovod" in sys.argv
hvd = importlib.import_module("horovod.torch" if HOROVOD else "kolo.torch")
_errors = importlib.import_module("horovod.common.exceptions" if HOROVOD else "kolo.exceptions")
HorovodInternalError = _errors.HorovodInternalError
HostsUpdatedInterrupt = _errors.HostsUpdatedInterrupt
#: Horovod's name of this worker's slot, added to its event lines.
SLOT = f"{os.environ.get('HOROVOD_HOSTNAME', '?')}[{os.environ.get('HOROVOD_LOCAL_RANK', '?')}]"


def emit(name: str) -> None:
    if HOROVOD:
        try:
            rank, size = hvd.rank(), hvd.size()
        except ValueError:  # Horovod before init() or between shutdown() and init()
            rank, size = -1, -1
        print(f"event {name} {time.time():.6f} {rank} {size} {SLOT} {os.getpid()}", flush=True)
        return
    rank, size = (hvd.rank(), hvd.size()) if hvd.is_initialized() else (-1, -1)
    print(f"event {name} {time.time():.6f} {rank} {size}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=1000, help="the linear layer's width")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--horovod", action="store_true", help="run on horovod.torch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    emit("up")
    hvd.init()
    emit("reset")
    torch.manual_seed(0)
    model = torch.nn.Linear(args.width, args.width)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model, optimizer, batch=0)
    state.register_reset_callbacks([lambda: emit("reset")])
    x = torch.randn(args.batch_size, args.width)
    emit("ready")

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        emit("synced")
        first = True
        while True:
            try:
                optimizer.zero_grad()
                model(x).square().mean().backward()
                optimizer.step()
                if first:
                    emit("step")
                    first = False
                state.batch += 1
                state.commit()
            except HorovodInternalError:
                emit("detected")
                raise
            except HostsUpdatedInterrupt:
                emit("interrupted")
                raise

    train(state)


if __name__ == "__main__":
    main()
