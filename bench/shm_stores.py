"""Shared-memory allreduce with each way of storing into the shared halves, interleaved.

    kolorun -np 2 python bench/shm_stores.py [--quick] [--min-bytes 65536]
        [--max-bytes 67108864] [--rounds 6] [--reps 30] [--json PATH]

``KOLO_SHM_STORES`` (read at ``hvd.init()``) is ``ordinary``, ``streaming`` (non-temporal
stores) or ``auto`` (the default: the first local rank measures both and keeps the cheaper per
size, docs/transport.md "Stores into a half"). For every size the script re-initializes kolo
with each value in turn, order flipped every round, and times ``--reps`` allreduces (a barrier
before each; median), then prints per size the median over rounds of each way and auto's time
over the better fixed way's (1.00 = auto found it; the trials it runs cost a little). Which
fixed way wins depends on how far apart the ranks' cores are, which on a VM changes as the
hypervisor moves vCPUs: run it more than once, with bench/core_round_trip.c beside it to tell
which state the host was in. ``--quick``: 2 rounds of 10 allreduces, up to 4 MiB. JSON goes to
bench/results/ (or ``--json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Optional

import torch
from common import write_results

import kolo.torch as hvd

WAYS = ("ordinary", "streaming", "auto")


def timed(tensor: torch.Tensor, reps: int) -> float:
    """Median seconds of one allreduce of `tensor` (after warm-up, a barrier before each)."""
    for _ in range(3):
        hvd.allreduce_(tensor, name="bench.shm_stores")
    times = []
    for _ in range(reps):
        hvd.barrier()
        start = time.perf_counter()
        hvd.allreduce_(tensor, name="bench.shm_stores")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--min-bytes", type=int, default=64 << 10)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="--rounds 2 --reps 10, up to 4 MiB")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.reps = min(args.rounds, 2), min(args.reps, 10)
        args.max_bytes = min(args.max_bytes, 4 << 20)
    torch.set_num_threads(1)
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    seconds: dict[str, dict[int, list[float]]] = {way: {s: [] for s in sizes} for way in WAYS}
    order = list(WAYS)
    rank: Optional[int] = None
    ranks = 0
    for _ in range(args.rounds):
        for way in order:
            os.environ["KOLO_SHM_STORES"] = way
            hvd.init()
            rank, ranks = hvd.rank(), hvd.size()
            for s in sizes:
                seconds[way][s].append(timed(torch.ones(s // 4), args.reps))
            hvd.shutdown()
        order.reverse()
    rows = []
    for s in sizes:
        median = {way: statistics.median(seconds[way][s]) for way in WAYS}
        best = min(median["ordinary"], median["streaming"])
        rows.append({"bytes": s, "seconds": median, "auto_over_best": median["auto"] / best})
        if rank == 0:
            print(
                f"allreduce {s:>10d} B: "
                + " | ".join(f"{way} {median[way] * 1e6:8.1f} us" for way in WAYS)
                + f" | ordinary/streaming {median['ordinary'] / median['streaming']:.2f}x"
                f" | auto/best {median['auto'] / best:.2f}x",
                flush=True,
            )
    if rank == 0:
        write_results("shm_stores", {"ranks": ranks, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
