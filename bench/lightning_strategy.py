"""Lightning CPU training throughput: ``strategy=KoloStrategy()`` vs Lightning's built-in
``"ddp"`` strategy (gloo), interleaved in one job.

    kolorun -np 2 python bench/lightning_strategy.py [--batch-size 64] [--steps 10] [--rounds 6]
        [--quick] [--json PATH]

Both run ``Trainer.fit`` in the same processes on the same LightningModule (bench/common.py's
small CNN, 3x32x32 synthetic images, 10 classes, SGD with momentum, same initial weights) and
the same data (a DataLoader into which each strategy injects its DistributedSampler). Under
kolorun the ``"ddp"`` strategy is given the job's ranks through Lightning's environment
variables (``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_PORT``...) and starts its gloo process
group itself; it is torn down after each of its rounds, so the kolo rounds run without one
(Lightning broadcasts a SIGTERM flag over ``torch.distributed`` every step whenever a group
exists). Each round fits one epoch of ``--warmup-steps + --steps`` batches with each strategy,
alternately (order flipped every round); the figure is the median over rounds of samples/sec
over all ranks on the ``--steps`` timed batches (batch size x ranks x steps / the slowest
rank's time), Trainer set-up excluded. Each rank uses one torch thread. Prints one line per
figure with the ratio kolo / ddp (target: >= 1.0) and writes JSON to bench/results/ (or
``--json``).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import SmallCNN, free_port, write_results
from torch.utils.data import DataLoader, TensorDataset

import kolo.torch as hvd
from kolo.lightning import KoloStrategy

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*sync_dist=True.*")


class Module(pl.LightningModule):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class StepTimer(pl.Callback):
    """Seconds from the start of batch ``warmup`` to the end of the last batch."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start = 0.0
        self.end = 0.0

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
        if idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
        self.end = time.perf_counter()


def ddp_environment(port: int) -> None:
    """Lightning's environment variables for an externally launched DDP job of kolo's ranks."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(hvd.size()),
        NODE_RANK="0",
        LOCAL_RANK=str(hvd.local_rank()),
        GROUP_RANK="0",
        RANK=str(hvd.rank()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per fit")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed steps per fit")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="--rounds 2 --steps 3 --warmup 1")
    parser.add_argument("--json", type=Path, default=None, help="where rank 0 writes results")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup_steps = 2, 3, 1

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = SmallCNN()
    batches = args.warmup_steps + args.steps
    generator = torch.Generator().manual_seed(1)
    rows = args.batch_size * size * batches
    data = TensorDataset(
        torch.randn(rows, 3, 32, 32, generator=generator),
        torch.randint(0, 10, (rows,), generator=generator),
    )
    models = {"kolo": Module(copy.deepcopy(base)), "ddp": Module(copy.deepcopy(base))}

    def fit(name: str) -> float:
        """One epoch with strategy ``name``; samples/sec over all ranks on the timed steps."""
        if name == "ddp":
            ddp_environment(hvd.broadcast_object(free_port() if rank == 0 else None))
            strategy: Any = "ddp"
            devices = size
        else:
            strategy, devices = KoloStrategy(), 1
        timer = StepTimer(args.warmup_steps)
        trainer = pl.Trainer(
            strategy=strategy,
            accelerator="cpu",
            devices=devices,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer],
        )
        trainer.fit(models[name], DataLoader(data, batch_size=args.batch_size))
        if dist.is_initialized():
            dist.destroy_process_group()
        elapsed = torch.tensor([timer.end - timer.start])
        slowest = float(hvd.allreduce(elapsed, op=hvd.Max, name="bench.elapsed").item())
        return args.batch_size * size * args.steps / slowest

    samples: dict[str, list[float]] = {"kolo": [], "ddp": []}
    order = list(samples)
    for _ in range(args.rounds):
        for name in order:
            samples[name].append(fit(name))
        order.reverse()  # kolo first, then ddp first, ...: neither always follows the other

    row = {name: statistics.median(values) for name, values in samples.items()}
    ratio = row["kolo"] / row["ddp"]
    if rank == 0:
        print(
            f"lightning smallcnn batch {args.batch_size}x{size}: "
            f"kolo {row['kolo']:8.1f} samples/s | ddp(gloo) {row['ddp']:8.1f} samples/s | "
            f"ratio {ratio:.2f}x",
            flush=True,
        )
        write_results(
            "lightning",
            {
                "ranks": size,
                "batch_size": args.batch_size,
                "steps": args.steps,
                "warmup_steps": args.warmup_steps,
                "rounds": args.rounds,
                "lightning_version": pl.__version__,
                "samples_per_sec": row,
                "rounds_samples_per_sec": samples,
                "ratio_kolo_over_ddp": ratio,
            },
            args.json,
        )


if __name__ == "__main__":
    main()
