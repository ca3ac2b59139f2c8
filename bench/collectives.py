"""Allreduce bandwidth: kolo vs torch.distributed (gloo), interleaved in one job.

    kolorun -np 2 python bench/collectives.py [--min-bytes 4096] [--max-bytes 268435456]

Both libraries run in the same 2 processes; for every size the two are timed alternately
(several rounds, median per library), so machine noise hits both alike. Prints one line per
size with time, algbw and busbw (nccl-tests definitions: algbw = S / t,
busbw = algbw * 2 (n - 1) / n) and the ratio kolo / gloo of busbw, and writes JSON to
bench/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from common import init_gloo, write_results

import kolo.torch as hvd


def human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def probe(op, tensor: torch.Tensor) -> float:
    """Seconds per call from a warm-up call and 3 timed ones (every rank makes the same calls)."""
    op(tensor)
    start = time.perf_counter()
    for _ in range(3):
        op(tensor)
    return (time.perf_counter() - start) / 3


def agreed_calls(seconds_per_call: float, budget_s: float) -> int:
    local = torch.tensor([max(3, int(budget_s / max(seconds_per_call, 1e-9)))])
    return int(hvd.allreduce(local, op=hvd.Min, name="bench.calls").item())


def timed(op, tensor: torch.Tensor, calls: int) -> float:
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        op(tensor)
    elapsed = torch.tensor([time.perf_counter() - start])
    return float(hvd.allreduce(elapsed, op=hvd.Max, name="bench.elapsed").item()) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--min-bytes", type=int, default=4096)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.4, help="seconds per timing")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    try:
        os.sched_setaffinity(0, {hvd.local_rank() % os.cpu_count()})
    except (AttributeError, OSError):
        pass
    init_gloo()

    def kolo_allreduce(t: torch.Tensor) -> None:
        hvd.allreduce_(t, op=hvd.Sum, name="bench")

    def gloo_allreduce(t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)

    results = []
    nbytes = args.min_bytes
    factor = 2 * (size - 1) / size
    while nbytes <= args.max_bytes:
        tensor = torch.ones(nbytes // 4, dtype=torch.float32)
        calls = {
            name: agreed_calls(probe(op, tensor), args.budget)
            for name, op in (("kolo", kolo_allreduce), ("gloo", gloo_allreduce))
        }
        samples: dict[str, list[float]] = {"kolo": [], "gloo": []}
        for _ in range(args.rounds):
            samples["kolo"].append(timed(kolo_allreduce, tensor, calls["kolo"]))
            samples["gloo"].append(timed(gloo_allreduce, tensor, calls["gloo"]))
        row = {"op": "allreduce", "dtype": "float32", "bytes": nbytes, "ranks": size}
        for name, times in samples.items():
            seconds = statistics.median(times)
            algbw = nbytes / seconds / 1e9
            row[name] = {
                "time_us": seconds * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * factor,
            }
        row["ratio_busbw_kolo_over_gloo"] = row["kolo"]["busbw_GBps"] / row["gloo"]["busbw_GBps"]
        results.append(row)
        if rank == 0:
            columns = [
                f"{name} {row[name]['time_us']:10.1f} us "
                f"algbw {row[name]['algbw_GBps']:6.3f} busbw {row[name]['busbw_GBps']:6.3f} GB/s"
                for name in ("kolo", "gloo")
            ]
            print(
                f"allreduce fp32 {human(nbytes):>9}: {columns[0]} | {columns[1]} | "
                f"ratio {row['ratio_busbw_kolo_over_gloo']:.2f}x",
                flush=True,
            )
        nbytes *= 4

    if rank == 0:
        write_results(
            "collectives",
            {
                "ranks": size,
                "results": results,
            },
        )
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
