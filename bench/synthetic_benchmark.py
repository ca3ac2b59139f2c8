"""Synthetic training throughput with Horovod's PyTorch API, Horovod's benchmark output format.

    kolorun -np 2 python bench/synthetic_benchmark.py [--model smallcnn] [--batch-size 32]
        [--num-warmup-batches 10] [--num-batches-per-iter 10] [--num-iters 10] [--fp16-allreduce]
        [--use-adasum] [--horovod auto|yes|no] [--horovod-blocks 2]

Every rank trains the model on one fixed random batch (no data loading) with
``hvd.DistributedOptimizer``, after ``hvd.broadcast_parameters`` and
``hvd.broadcast_optimizer_state``; rank 0 prints the figures the way Horovod's
``pytorch_synthetic_benchmark.py`` does (``Iter #k: X img/sec per CPU``,
``Img/sec per CPU: M +-C``, ``Total img/sec on N CPU(s): T +-C``, C the 95% confidence
half-width) and writes JSON to bench/results/ (or ``--json PATH``).

Models: ``smallcnn`` (default: two conv layers and two linear ones on 3x32x32 images, quick on
CPU) and ``mlp``; with torchvision installed, any ``torchvision.models`` name too (``resnet50``,
on 224x224 images unless ``--image-size`` says otherwise). Each rank uses one CPU thread
(``--num-threads``). ``--use-adasum`` reduces with ``op=hvd.Adasum`` (on a power-of-two number
of ranks) and, as Horovod's benchmark, does not scale the learning rate by the rank count.

Horovod 0.28.1 (``--horovod auto``: when bench/peers/horovod.sh built its venv): kolo's
iterations run in ``--horovod-blocks`` blocks, each followed by this script under
``horovodrun --gloo`` on as many ranks (``--horovod-peer``, bench/peers/_horovod_beside.py)
with the same arguments on ``horovod.torch`` (its warm-up, then that block's iterations). Rank 0
prints Horovod's iterations (``horovod Iter #k: ...``), then its ``Total img/sec`` and kolo /
Horovod (target >= 1.25x) after kolo's. For the same torch on both sides, start the job with
the peer venv's python (``kolorun -np 2 <venv>/bin/python ...``).

The no-communication ceiling: kolo's run also trains a copy of the model with the same
optimizer on the same batch with no allreduce (every rank alone), one iteration of it beside
each of kolo's (alternately first, each after a barrier), as bench/training.py does
(``common.no_communication_step``). Rank 0 prints the ceiling's img/sec per CPU, the share of
it kolo (target >= 97%) and Horovod reach, and the bound that implies: kolo / Horovod is at
most ceiling / Horovod; when that is below 1.25x (Horovod above 80% of the ceiling) one more
line says the target is physically unreachable on this workload (``common.ceiling_lines``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from common import (
    SmallCNN,
    ceiling_figures,
    ceiling_lines,
    no_communication_step,
    train_step,
    write_results,
)
from peers import _horovod_beside as horovod_peer
from torch import nn

# kolo.torch, or horovod.torch in this script's Horovod run (the same calls).
hvd = horovod_peer.library()

BUILTIN_MODELS = ("smallcnn", "mlp")


def build_model(name: str, num_classes: int, image_size: int) -> nn.Module:
    if name == "smallcnn":
        return SmallCNN(num_classes, image_size)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * image_size * image_size, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, num_classes),
        )
    import torchvision.models  # checked in parse_args

    return getattr(torchvision.models, name)(num_classes=num_classes)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smallcnn", help="smallcnn, mlp or a torchvision name")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per batch")
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--num-classes", type=int, default=None, help="default 10 or 1000")
    parser.add_argument("--image-size", type=int, default=None, help="default 32 or 224")
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--fp16-allreduce", action="store_true", help="hvd.Compression.fp16 on the wire"
    )
    parser.add_argument("--use-adasum", action="store_true", help="reduce with hvd.Adasum")
    parser.add_argument("--json", type=Path, default=None, help="where rank 0 writes results")
    parser.add_argument(
        "--horovod-blocks",
        type=int,
        default=2,
        help="with Horovod: kolo's iterations run in this many blocks (at most --num-iters), a "
        "Horovod run after each",
    )
    horovod_peer.add_arguments(parser)
    args = parser.parse_args()
    if args.horovod_blocks < 1:
        parser.error("--horovod-blocks must be at least 1")
    args.horovod_blocks = min(args.horovod_blocks, args.num_iters)
    for flag in ("batch_size", "num_batches_per_iter", "num_iters", "num_threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.num_warmup_batches < 0:
        parser.error("--num-warmup-batches must be 0 or more")
    torchvision_model = args.model not in BUILTIN_MODELS
    if torchvision_model:
        try:
            import torchvision.models
        except ImportError:
            parser.error(
                f"--model {args.model}: torchvision is not installed; use one of "
                f"{', '.join(BUILTIN_MODELS)}"
            )
        if not callable(getattr(torchvision.models, args.model, None)):
            parser.error(f"--model {args.model}: not a model in torchvision.models")
    if args.num_classes is None:
        args.num_classes = 1000 if torchvision_model else 10
    if args.image_size is None:
        args.image_size = 224 if torchvision_model else 32
    if args.model == "smallcnn" and args.image_size % 4:
        parser.error("--image-size must be a multiple of 4 for smallcnn")
    return args


def horovod_args(args: argparse.Namespace, iters: int) -> list[str]:
    """The Horovod run's arguments: this run's, with ``iters`` iterations."""
    out = [
        *("--model", args.model, "--batch-size", str(args.batch_size)),
        *("--num-warmup-batches", str(args.num_warmup_batches)),
        *("--num-batches-per-iter", str(args.num_batches_per_iter)),
        *("--num-iters", str(iters), "--horovod-blocks", "1"),
        *("--num-classes", str(args.num_classes), "--image-size", str(args.image_size)),
        *("--num-threads", str(args.num_threads)),
    ]
    if args.fp16_allreduce:
        out.append("--fp16-allreduce")
    if args.use_adasum:
        out.append("--use-adasum")
    return out


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(0)
    rank, size = hvd.rank(), hvd.size()
    peer_python = None
    if not args.horovod_peer:
        peer_python = horovod_peer.peer_python(
            args.horovod, "synthetic_benchmark", announce=rank == 0
        )

    model = build_model(args.model, args.num_classes, args.image_size)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))
    # Horovod scales the learning rate by the number of ranks (not with Adasum).
    lr = 0.01 * (1 if args.use_adasum else size)
    # The no-communication ceiling (kolo's run): the same model, optimizer and batch, every
    # rank training alone, timed interleaved with kolo's iterations.
    ceiling_batch = None if args.horovod_peer else no_communication_step(model, data, target, lr)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    train_batch = train_step(model, optimizer, data, target)

    def iteration(batch: Callable[[], None]) -> float:
        """Images/sec of this rank over ``--num-batches-per-iter`` batches."""
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            batch()
        return args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)

    def log(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {size}")
    log("Running warmup...")
    for _ in range(args.num_warmup_batches):
        train_batch()
        if ceiling_batch is not None:
            ceiling_batch()
    horovod: Optional[horovod_peer.HorovodBeside] = None
    if peer_python is not None:
        horovod = horovod_peer.HorovodBeside(hvd, peer_python, Path(__file__).resolve())
    log("Running benchmark...")
    img_secs: list[float] = []
    ceiling_secs: list[float] = []
    kolo_first = True
    horovod_runs: list[dict[str, Any]] = []
    horovod_iters = 0
    blocks = args.horovod_blocks if horovod is not None else 1
    for block in range(blocks):
        iters = args.num_iters // blocks + (block < args.num_iters % blocks)
        for _ in range(iters):
            if ceiling_batch is None:
                img_secs.append(iteration(train_batch))
            else:
                # Alternately first, so neither always follows the other; each after a
                # barrier, so neither counts the wait for the other rank's end of the other.
                for kolo in (kolo_first, not kolo_first):
                    hvd.barrier()
                    if kolo:
                        img_secs.append(iteration(train_batch))
                    else:
                        ceiling_secs.append(iteration(ceiling_batch))
                kolo_first = not kolo_first
            log(f"Iter #{len(img_secs) - 1}: {img_secs[-1]:.1f} img/sec per CPU")
        if horovod is not None:
            theirs = horovod.run(horovod_args(args, iters), timeout=1800)
            horovod_runs.append(theirs)
            for value in theirs.get("img_sec_per_rank", []):
                log(f"horovod Iter #{horovod_iters}: {value:.1f} img/sec per CPU")
                horovod_iters += 1

    mean = statistics.mean(img_secs)
    conf = 1.96 * statistics.pstdev(img_secs)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} CPU(s): {size * mean:.1f} +-{size * conf:.1f}")
    horovod_figures = None
    if horovod is not None and rank == 0:
        horovod_figures = horovod_summary(horovod_runs, mean, size)
    ceiling = None
    if ceiling_batch is not None:
        theirs = (horovod_figures or {}).get("img_sec_per_rank_mean")
        ceiling = ceiling_figures(mean, statistics.mean(ceiling_secs), theirs)
        for line in ceiling_lines(ceiling, "img/sec per CPU"):
            log(line)

    if args.horovod_peer:
        if rank == 0:
            horovod_peer.emit_result({"img_sec_per_rank": img_secs, "torch": torch.__version__})
    elif rank == 0:
        write_results(
            "synthetic_benchmark",
            {
                "ranks": size,
                "model": args.model,
                "batch_size": args.batch_size,
                "image_size": args.image_size,
                "fp16_allreduce": args.fp16_allreduce,
                "use_adasum": args.use_adasum,
                "img_sec_per_rank": img_secs,
                "img_sec_per_rank_mean": mean,
                "img_sec_per_rank_conf95": conf,
                "img_sec_total": size * mean,
                "horovod": horovod_figures,
                "no_communication_img_sec_per_rank": ceiling_secs,
                "no_communication": ceiling,
                "load_average": os.getloadavg(),
            },
            args.json,
        )
    if horovod is not None:
        horovod.close()
    hvd.shutdown()


def horovod_summary(runs: list[dict[str, Any]], kolo_mean: float, size: int) -> dict[str, Any]:
    """Prints Horovod's figures beside kolo's (rank 0) and returns them for the JSON."""
    theirs = [x for run in runs for x in run.get("img_sec_per_rank", [])]
    failed = [run["error"] for run in runs if "error" in run]
    figures: dict[str, Any] = {"runs": len(runs), "failed_runs": failed}
    if not theirs:
        print(f"horovod: no figures ({len(failed)} of {len(runs)} runs failed)", flush=True)
        print(failed[0] if failed else "", flush=True)
        return figures
    mean, conf = statistics.mean(theirs), 1.96 * statistics.pstdev(theirs)
    torches = sorted({run["torch"] for run in runs if "torch" in run})
    figures.update(
        img_sec_per_rank=theirs,
        img_sec_per_rank_mean=mean,
        img_sec_total=size * mean,
        ratio_kolo_over_horovod=kolo_mean / mean,
        torch=torches,
        same_torch=torches == [torch.__version__],
    )
    note = (
        ""
        if figures["same_torch"]
        else (f" [not the same torch: kolo {torch.__version__}, horovod {', '.join(torches)}]")
    )
    print(
        f"horovod 0.28.1 Total img/sec on {size} CPU(s): {size * mean:.1f} +-{size * conf:.1f} | "
        f"kolo/horovod {kolo_mean / mean:.2f}x (target >= 1.25x){note}"
        + (f" ({len(failed)} runs failed)" if failed else ""),
        flush=True,
    )
    return figures


if __name__ == "__main__":
    main()
