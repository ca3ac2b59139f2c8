"""One Horovod rank of bench/elastic.py: bench/_elastic_rank.py's loop on ``horovod.torch``.

    horovodrun --gloo ... python bench/peers/_horovod_elastic_rank.py [--width 1000]
    (started by bench/elastic.py through bench/peers/_horovod.py, in the Horovod venv)

The same model (a ``width`` x ``width`` linear layer), optimizer (``DistributedOptimizer`` +
SGD), batch, ``TorchState`` commit after every step under ``hvd.elastic.run``, and the same
``event <name> <time.time()> <rank> <size>`` lines with the same meanings as
bench/_elastic_rank.py (``up``, ``detected``, ``interrupted``, ``reset``, ``ready``,
``synced``, ``step``), each followed by this worker's slot as Horovod's driver names it
(``host[local_rank]`` from ``HOROVOD_HOSTNAME`` and ``HOROVOD_LOCAL_RANK`` at start) and its
pid, so the bench can tell the workers apart and SIGKILL one. It runs until killed.
"""

from __future__ import annotations

import argparse
import os
import time

import horovod.torch as hvd
import torch
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

SLOT = f"{os.environ.get('HOROVOD_HOSTNAME', '?')}[{os.environ.get('HOROVOD_LOCAL_RANK', '?')}]"


def emit(name: str) -> None:
    try:
        rank, size = hvd.rank(), hvd.size()
    except ValueError:  # Horovod before init() or between shutdown() and init()
        rank, size = -1, -1
    print(f"event {name} {time.time():.6f} {rank} {size} {SLOT} {os.getpid()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=1000, help="the linear layer's width")
    parser.add_argument("--batch-size", type=int, default=16)
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
