"""CPU training throughput: kolo's DistributedOptimizer vs torch DDP (gloo), interleaved in one job.

    kolorun -np 2 python bench/training.py [--batch-size 64] [--steps 5] [--rounds 20]
        [--quick] [--json PATH] [--single-rank-json PATH]

Both trainers run in the same processes on the same small CNN (3x32x32 synthetic images, 10
classes, same initial weights): kolo as ``hvd.DistributedOptimizer`` around SGD, the peer as
``torch.nn.parallel.DistributedDataParallel`` over a gloo process group. Each round times
``--steps`` steps of each, alternately (short rounds, order flipped every round), so machine
noise hits both alike; the figure is the median over rounds of samples/sec over all ranks
(batch size x ranks x steps / slowest rank's time). Each rank uses one torch thread
(``--pin``: also one core). Prints one line with both figures and the ratio kolo / DDP
(target: >= 1.0), and writes JSON to bench/results/ (or ``--json``).

Scaling: run it once with ``-np 1`` (``--json one.json``) and then with ``-np 2
--single-rank-json one.json``; the second prints each trainer's scaling efficiency,
samples/s on n ranks / (n x samples/s on 1 rank) (``bench/run_all.sh`` does both).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import SmallCNN, init_gloo, write_results
from torch.nn.parallel import DistributedDataParallel

import kolo.torch as hvd


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=5, help="steps per trainer per round")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin each rank to one core (off by default: on a shared machine a pinned rank "
        "cannot move away from a busy core, which slows small collectives many times over)",
    )
    parser.add_argument("--quick", action="store_true", help="--rounds 6 --warmup-steps 2")
    parser.add_argument("--json", type=Path, default=None, help="where rank 0 writes results")
    parser.add_argument(
        "--single-rank-json",
        type=Path,
        default=None,
        help="results of a 1-rank run of this script: print scaling efficiency against it",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.warmup_steps = min(args.rounds, 6), min(args.warmup_steps, 2)

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    if args.pin:
        try:
            os.sched_setaffinity(0, {hvd.local_rank() % os.cpu_count()})
        except (AttributeError, OSError):
            pass
    init_gloo()

    torch.manual_seed(0)
    base = SmallCNN()
    kolo_model = copy.deepcopy(base)
    kolo_optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(kolo_model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=kolo_model.named_parameters(),
    )
    hvd.broadcast_parameters(kolo_model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(kolo_optimizer, root_rank=0)
    ddp_model = DistributedDataParallel(copy.deepcopy(base))  # broadcasts rank 0's weights
    ddp_optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    # The ceiling: the same steps with no communication at all (every rank trains alone).
    local_model = copy.deepcopy(base)
    local_optimizer = torch.optim.SGD(local_model.parameters(), lr=0.01, momentum=0.9)

    generator = torch.Generator().manual_seed(rank)
    data = torch.randn(args.batch_size, 3, 32, 32, generator=generator)
    target = torch.randint(0, 10, (args.batch_size,), generator=generator)

    def kolo_step() -> None:
        kolo_optimizer.zero_grad()
        F.cross_entropy(kolo_model(data), target).backward()
        kolo_optimizer.step()

    def ddp_step() -> None:
        ddp_optimizer.zero_grad()
        F.cross_entropy(ddp_model(data), target).backward()
        ddp_optimizer.step()

    def local_step() -> None:
        local_optimizer.zero_grad()
        F.cross_entropy(local_model(data), target).backward()
        local_optimizer.step()

    def timed(step, steps: int) -> float:
        """Samples/sec over all ranks for ``steps`` steps (the slowest rank's time)."""
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        elapsed = torch.tensor([time.perf_counter() - start])
        slowest = float(hvd.allreduce(elapsed, op=hvd.Max, name="bench.elapsed").item())
        return args.batch_size * size * steps / slowest

    trainers = {"kolo": kolo_step, "ddp": ddp_step, "no_comm": local_step}
    for step in trainers.values():
        timed(step, args.warmup_steps)
    samples: dict[str, list[float]] = {name: [] for name in trainers}
    order = list(trainers)
    for _ in range(args.rounds):
        for name in order:
            samples[name].append(timed(trainers[name], args.steps))
        order.reverse()  # kolo first, then DDP first, ...: neither always follows the other

    row = {name: statistics.median(values) for name, values in samples.items()}
    ratio = row["kolo"] / row["ddp"]
    if rank == 0:
        print(
            f"training smallcnn batch {args.batch_size}x{size}: "
            f"kolo {row['kolo']:8.1f} samples/s | ddp(gloo) {row['ddp']:8.1f} samples/s | "
            f"ratio {ratio:.2f}x | no communication {row['no_comm']:8.1f} samples/s "
            f"(kolo reaches {row['kolo'] / row['no_comm']:.0%} of it, ddp "
            f"{row['ddp'] / row['no_comm']:.0%})",
            flush=True,
        )
        scaling = None
        if args.single_rank_json is not None:
            one = json.loads(args.single_rank_json.read_text())["median_samples_per_sec"]
            scaling = {name: row[name] / (size * one[name]) for name in row}
            print(
                f"scaling 1 -> {size} ranks: kolo {row['kolo'] / one['kolo']:.2f}x "
                f"({scaling['kolo']:.0%} efficiency) | ddp(gloo) {row['ddp'] / one['ddp']:.2f}x "
                f"({scaling['ddp']:.0%} efficiency) | efficiency kolo/ddp "
                f"{scaling['kolo'] / scaling['ddp']:.2f}x",
                flush=True,
            )
        write_results(
            "training",
            {
                "ranks": size,
                "model": "smallcnn",
                "batch_size_per_rank": args.batch_size,
                "steps_per_round": args.steps,
                "samples_per_sec": samples,
                "median_samples_per_sec": row,
                "ratio_kolo_over_ddp": ratio,
                "single_rank_median_samples_per_sec": (
                    json.loads(args.single_rank_json.read_text())["median_samples_per_sec"]
                    if args.single_rank_json
                    else None
                ),
                "scaling_efficiency": scaling,
            },
            args.json,
        )
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
