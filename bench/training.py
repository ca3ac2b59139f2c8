"""CPU training throughput: kolo's DistributedOptimizer vs torch DDP (gloo) and Horovod 0.28.1,
interleaved in one run.

    kolorun -np 2 python bench/training.py [--batch-size 64] [--steps 5] [--rounds 20]
        [--quick] [--horovod auto|yes|no] [--horovod-blocks 4] [--json PATH]
        [--single-rank-json PATH] [--autotune [--thresholds-mib 0,0.25,1,4,128]
        [--cycle-times-ms 0,0.1,1,5] [--caches 0,1] [--retime-rounds 15]]

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

Horovod 0.28.1 (``--horovod auto``: when bench/peers/horovod.sh built its venv): the rounds run
in ``--horovod-blocks`` blocks, each followed by this script under ``horovodrun --gloo`` on as
many ranks (``--horovod-peer``, bench/peers/_horovod_beside.py) training the same model from
the same weights on the same data with ``horovod.torch``'s ``DistributedOptimizer``: its
warm-up steps, then that block's rounds of ``--steps`` steps, timed the same way. It prints a
second line: Horovod's samples/s and kolo / Horovod (target >= 1.25x), then the share of the
no-communication ceiling each reaches (kolo's target >= 97%) and the bound it implies, kolo /
Horovod <= ceiling / Horovod, with one more line when that bound is below the 1.25x target
(``common.ceiling_lines``, shared with bench/synthetic_benchmark.py). It also prints the
synchronous floor (``common.synchronous_floor``): from the ceiling's own per-step times, the
sum over steps of the slowest rank's step, which no synchronous trainer can beat (each step
ends with its slowest rank), and kolo's share of it; and the lockstep floor
(``common.lockstep_step``): the no-communication step followed by a 4-byte kolo allreduce,
timed in the same rounds, i.e. the ranks stepping together as a synchronous trainer's must but
moving no gradient; on a machine whose two cores share their caches and memory, ranks that
run the same phase at the same time contend for them, which the ceiling does not pay. For the
same torch on
both sides, start the job with the peer venv's python (``kolorun -np 2 <venv>/bin/python
...``); the line says when the two differ.

``--autotune`` then times kolo's trainer on every point of an exhaustive grid of the knobs
Horovod's autotune tunes (fusion threshold x cycle time x response cache; hierarchical
allreduce/allgather do not apply on one host): ``--warmup-steps``, then ``--steps`` timed steps
per point. It then runs kolo's autotuner (``KOLO_AUTOTUNE=1``; ``kolorun --autotune-*`` flags
steer it, ``--autotune-log-file`` names its CSV log, else bench/results/) from the default
setting until it keeps one, and prints the kept setting against the grid's best, in the search
and re-timed: interleaved with the grid's 3 best points and the default over ``--retime-rounds``
rounds (15), by the median of the per-round ratios to the re-timed best with its 96 % interval
and a verdict (met / missed / unresolved), with the load average; and the steps the search took
against Horovod's defaults (>= 1200 steps); ``common.autotune_against_grid`` (shared with
bench/fusion.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from common import (
    RETIME_ROUNDS,
    SmallCNN,
    autotune_against_grid,
    ceiling_figures,
    ceiling_lines,
    csv_floats,
    grid_settings,
    init_gloo,
    lockstep_floor_line,
    lockstep_step,
    no_communication_step,
    reinit,
    seconds_per_step,
    synchronous_floor,
    synchronous_floor_line,
    take_autotune_environment,
    train_step,
    write_results,
)
from peers import _horovod_beside as horovod_peer
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# kolo.torch, or horovod.torch in this script's Horovod run (the same calls).
hvd = horovod_peer.library()


def parse_args() -> argparse.Namespace:
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
    parser.add_argument(
        "--horovod-blocks",
        type=int,
        default=4,
        help="with Horovod: the rounds run in this many blocks (at most --rounds), a Horovod "
        "run after each",
    )
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="then time an exhaustive grid of the tuned knobs and run kolo's autotuner against it",
    )
    parser.add_argument(
        "--thresholds-mib",
        type=csv_floats,
        default=[0, 0.25, 1, 4, 128],
        help="the grid's fusion thresholds (the model's gradients are 2.1 MiB)",
    )
    parser.add_argument("--cycle-times-ms", type=csv_floats, default=[0, 0.1, 1, 5])
    parser.add_argument(
        "--caches", type=csv_floats, default=[0, 1], help="the grid's response cache off/on"
    )
    parser.add_argument(
        "--retime-rounds",
        type=int,
        default=RETIME_ROUNDS,
        help="--autotune: rounds of the paired re-timing",
    )
    horovod_peer.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.warmup_steps = min(args.rounds, 6), min(args.warmup_steps, 2)
    if args.horovod_blocks < 1:
        parser.error("--horovod-blocks must be at least 1")
    args.horovod_blocks = min(args.horovod_blocks, args.rounds)
    return args


def setup(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """One torch thread (and one core with ``--pin``), then the model every trainer starts
    from (seed 0) and this rank's batch (seeded by its rank): the same in the Horovod run."""
    torch.set_num_threads(1)
    if args.pin:
        try:
            os.sched_setaffinity(0, {hvd.local_rank() % os.cpu_count()})
        except (AttributeError, OSError):
            pass
    torch.manual_seed(0)
    base = SmallCNN()
    generator = torch.Generator().manual_seed(hvd.rank())
    data = torch.randn(args.batch_size, 3, 32, 32, generator=generator)
    target = torch.randint(0, 10, (args.batch_size,), generator=generator)
    return base, data, target


def distributed_optimizer_step(
    base: nn.Module, data: torch.Tensor, target: torch.Tensor
) -> Callable[[], None]:
    """A step of ``hvd.DistributedOptimizer`` around SGD (kolo's, or Horovod's in the Horovod
    run), after broadcasting rank 0's weights and optimizer state."""
    model = copy.deepcopy(base)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return train_step(model, optimizer, data, target)


def timed(step: Callable[[], None], steps: int, batch_size: int) -> float:
    """Samples/sec over all ranks for ``steps`` steps (the slowest rank's time)."""
    return timed_steps(step, steps, batch_size)[0]


def timed_steps(step: Callable[[], None], steps: int, batch_size: int) -> tuple[float, list[float]]:
    """``timed``'s samples/sec, and this rank's duration of each step (seconds)."""
    hvd.barrier()
    start = time.perf_counter()
    durations = []
    for _ in range(steps):
        began = time.perf_counter()
        step()
        durations.append(time.perf_counter() - began)
    elapsed = torch.tensor([time.perf_counter() - start])
    slowest = float(hvd.allreduce(elapsed, op=hvd.Max, name="bench.elapsed").item())
    return batch_size * hvd.size() * steps / slowest, durations


def horovod_main(args: argparse.Namespace) -> None:
    """This script's Horovod run (``--horovod-peer``): Horovod's DistributedOptimizer on the
    same model, weights and data; its warm-up, then ``--rounds`` timed rounds. Rank 0 hands
    back the samples/s of each round."""
    hvd.init()
    base, data, target = setup(args)
    step = distributed_optimizer_step(base, data, target)
    timed(step, args.warmup_steps, args.batch_size)
    samples = [timed(step, args.steps, args.batch_size) for _ in range(args.rounds)]
    if hvd.rank() == 0:
        horovod_peer.emit_result({"samples_per_sec": samples, "torch": torch.__version__})
    hvd.shutdown()


def blocks(rounds: int, count: int) -> list[int]:
    """``rounds`` cut into ``count`` blocks as even as can be."""
    return [rounds // count + (i < rounds % count) for i in range(count)]


def main() -> None:
    args = parse_args()
    if args.horovod_peer:
        horovod_main(args)
        return
    # The comparison (and Horovod's run) is untuned; only --autotune's run gets these.
    autotune_env = take_autotune_environment()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    peer_python = horovod_peer.peer_python(args.horovod, "training", announce=rank == 0)
    init_gloo()

    base, data, target = setup(args)
    kolo_step = distributed_optimizer_step(base, data, target)
    ddp_model = DistributedDataParallel(copy.deepcopy(base))  # broadcasts rank 0's weights
    ddp_step = train_step(
        ddp_model, torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9), data, target
    )
    # The ceiling: the same steps with no communication at all (every rank trains alone).
    local_step = no_communication_step(base, data, target, lr=0.01)
    # The lockstep floor: the same, with the ranks stepping together (a 4-byte allreduce).
    lockstep = lockstep_step(no_communication_step(base, data, target, lr=0.01))

    trainers = {"kolo": kolo_step, "ddp": ddp_step, "no_comm": local_step, "lockstep": lockstep}
    for step in trainers.values():
        timed(step, args.warmup_steps, args.batch_size)
    samples: dict[str, list[float]] = {name: [] for name in trainers}
    horovod: Optional[horovod_peer.HorovodBeside] = None
    horovod_runs: list[dict[str, Any]] = []
    if peer_python is not None:
        horovod = horovod_peer.HorovodBeside(hvd, peer_python, Path(__file__).resolve())
        samples["horovod"] = []
    order = list(trainers)
    floor: list[float] = []
    for block in blocks(args.rounds, args.horovod_blocks if horovod else 1):
        for _ in range(block):
            for name in order:
                rate, durations = timed_steps(trainers[name], args.steps, args.batch_size)
                samples[name].append(rate)
                if name == "no_comm":
                    each = args.batch_size * size * args.steps
                    floor.append(each / synchronous_floor(durations))
            order.reverse()  # kolo first, then DDP first, ...: neither always follows the other
        if horovod is not None:
            theirs = horovod.run(horovod_args(args, block), timeout=1200)
            horovod_runs.append(theirs)
            samples["horovod"] += theirs.get("samples_per_sec", [])

    row = {name: statistics.median(values) for name, values in samples.items() if values}
    floor_rate = statistics.median(floor)
    ratio = row["kolo"] / row["ddp"]
    record: dict[str, Any] = {}
    if rank == 0:
        print(
            f"training smallcnn batch {args.batch_size}x{size}: "
            f"kolo {row['kolo']:8.1f} samples/s | ddp(gloo) {row['ddp']:8.1f} samples/s | "
            f"ratio {ratio:.2f}x | no communication {row['no_comm']:8.1f} samples/s "
            f"(kolo reaches {row['kolo'] / row['no_comm']:.0%} of it, ddp "
            f"{row['ddp'] / row['no_comm']:.0%})",
            flush=True,
        )
        print(synchronous_floor_line(row["kolo"], row["no_comm"], floor_rate))
        print(lockstep_floor_line(row["kolo"], row["no_comm"], row["lockstep"]), flush=True)
        horovod_figures = None
        if horovod is not None:
            horovod_figures = horovod_summary(row, horovod_runs, args.batch_size, size)
        scaling = None
        if args.single_rank_json is not None:
            one = json.loads(args.single_rank_json.read_text())["median_samples_per_sec"]
            scaling = {name: row[name] / (size * one[name]) for name in row if name in one}
            print(
                f"scaling 1 -> {size} ranks: kolo {row['kolo'] / one['kolo']:.2f}x "
                f"({scaling['kolo']:.0%} efficiency) | ddp(gloo) {row['ddp'] / one['ddp']:.2f}x "
                f"({scaling['ddp']:.0%} efficiency) | efficiency kolo/ddp "
                f"{scaling['kolo'] / scaling['ddp']:.2f}x",
                flush=True,
            )
        record = {
            "ranks": size,
            "model": "smallcnn",
            "batch_size_per_rank": args.batch_size,
            "steps_per_round": args.steps,
            "samples_per_sec": samples,
            "median_samples_per_sec": row,
            "ratio_kolo_over_ddp": ratio,
            "kolo_share_of_no_comm": row["kolo"] / row["no_comm"],
            "synchronous_floor_samples_per_sec": floor_rate,
            "kolo_share_of_synchronous_floor": row["kolo"] / floor_rate,
            "lockstep_floor_share_of_no_comm": row["lockstep"] / row["no_comm"],
            "kolo_share_of_lockstep_floor": row["kolo"] / row["lockstep"],
            "horovod": horovod_figures,
            "single_rank_median_samples_per_sec": (
                json.loads(args.single_rank_json.read_text())["median_samples_per_sec"]
                if args.single_rank_json
                else None
            ),
            "scaling_efficiency": scaling,
        }
    if horovod is not None:
        horovod.close()
    if args.autotune:
        record["grid"], record["autotune"] = autotune_training(
            args, base, data, target, autotune_env
        )
    if rank == 0:
        write_results("training", record, args.json)
    dist.destroy_process_group()
    hvd.shutdown()


def autotune_training(
    args: argparse.Namespace,
    base: nn.Module,
    data: torch.Tensor,
    target: torch.Tensor,
    autotune_env: dict[str, str],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Times kolo's trainer on every grid point (rank 0 prints a line each), then runs the
    autotuner against that grid; returns the grid's rows and the autotune figures."""
    grid = {}
    rows = []
    for setting in grid_settings(args.thresholds_mib, args.cycle_times_ms, args.caches):
        reinit(setting)
        step = distributed_optimizer_step(base, data, target)
        for _ in range(args.warmup_steps):
            step()
        grid[setting] = seconds_per_step(step, args.steps)
        rows.append({**setting._asdict(), "step_s": grid[setting]})
        if hvd.rank() == 0:
            print(f"grid {setting.describe()}: {grid[setting] * 1e3:.2f} ms/step", flush=True)
    figures = autotune_against_grid(
        "training",
        grid,
        lambda: distributed_optimizer_step(base, data, target),
        args.steps,
        autotune_env,
        args.retime_rounds,
    )
    return rows, figures


def horovod_args(args: argparse.Namespace, rounds: int) -> list[str]:
    """The Horovod run's arguments for one block of ``rounds`` rounds."""
    return [
        *("--batch-size", str(args.batch_size), "--steps", str(args.steps)),
        *("--warmup-steps", str(args.warmup_steps), "--rounds", str(rounds)),
        *("--horovod-blocks", "1"),
        *(["--pin"] if args.pin else []),
    ]


def horovod_summary(
    row: dict[str, float], runs: list[dict[str, Any]], batch_size: int, size: int
) -> dict[str, Any]:
    """Prints Horovod's line (rank 0) and returns its figures for the JSON."""
    failed = [run["error"] for run in runs if "error" in run]
    figures: dict[str, Any] = {"runs": len(runs), "failed_runs": failed}
    if "horovod" not in row:
        print(f"horovod: no figures ({len(failed)} of {len(runs)} runs failed)", flush=True)
        print(failed[0] if failed else "", flush=True)
        return figures
    theirs = row["horovod"]
    torches = {run["torch"] for run in runs if "torch" in run}
    same = torches == {torch.__version__}
    figures.update(
        median_samples_per_sec=theirs,
        horovod_share_of_no_comm=theirs / row["no_comm"],
        torch=sorted(torches),
        same_torch=same,
        **ceiling_figures(row["kolo"], row["no_comm"], theirs),
    )
    note = (
        ""
        if same
        else (
            f" [not the same torch: kolo {torch.__version__}, horovod {', '.join(sorted(torches))}:"
            " start kolorun with the Horovod venv's python for a like-for-like ratio]"
        )
    )
    print(
        f"training smallcnn batch {batch_size}x{size}: horovod 0.28.1 {theirs:8.1f} samples/s | "
        f"kolo/horovod {row['kolo'] / theirs:.2f}x (target >= 1.25x){note}"
        + (f" ({len(failed)} runs failed)" if failed else ""),
        flush=True,
    )
    for line in ceiling_lines(figures, "samples/s"):
        print(line, flush=True)
    return figures


if __name__ == "__main__":
    main()
