"""Collectives: kolo (transport auto and tcp forced) vs torch.distributed gloo and Horovod
0.28.1, interleaved.

    kolorun -np 2 python bench/collectives.py [--quick] [--ops allreduce,allgather,...]
        [--dtypes float32,bfloat16] [--transports auto,tcp] [--min-bytes 8]
        [--max-bytes 268435456] [--rounds 3] [--budget 0.3] [--horovod auto|yes|no]
        [--json PATH]

Every rank is pinned to one core. kolo's transport is chosen at ``hvd.init()`` from
``KOLO_TRANSPORT``, so for every size the script runs each transport in turn (``hvd.shutdown()``,
set ``KOLO_TRANSPORT``, ``hvd.init()``: a few ms) and, within it, for every op and dtype times
kolo and gloo alternately (``--rounds`` rounds, median per library), so machine noise hits both
alike. For allreduce it also times 2 concurrent memcpys of the same size (each rank copies its
own buffer at the same time): the physical floor of a shared-memory allreduce.

``adasum`` is kolo's ``op=hvd.Adasum`` allreduce (power-of-two rank counts) against gloo's Sum
allreduce (gloo has no Adasum). S (the size axis) follows nccl-tests: the tensor for allreduce,
adasum and broadcast, the gathered output for allgather, the input for reducescatter, and each
rank's send buffer for alltoall.
algbw = S / t; busbw = algbw x 2(n-1)/n (allreduce, adasum), (n-1)/n (allgather, reducescatter,
alltoall), 1 (broadcast). One line per (op, dtype, size) with each kolo transport's time and
busbw, its ratio to gloo's busbw and, for allreduce, its time over the 2-memcpy time. JSON
(with the newest calibration as the physical-limit denominators) goes to bench/results/.

Horovod 0.28.1 (``--horovod auto``: when bench/peers/horovod.sh built its venv) is timed at
every size right after kolo and gloo: this script again under ``horovodrun --gloo`` on as many
ranks (``--horovod-peer``, bench/peers/_horovod_beside.py), the same calls through
``horovod.torch``, the same rounds, budget and pinning. Its five collectives are allreduce,
allgather, broadcast, alltoall and reducescatter (its Adasum needs MPI, which this CPU/gloo
build lacks; it has no bfloat16 on CPU: that dtype's rows say so). Each kolo transport's line
adds its busbw over Horovod's (``kolo/horovod``). To run kolo on the same torch as Horovod,
start the job with the peer venv's python (``kolorun -np 2 <venv>/bin/python ...``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from common import human, init_gloo, load_calibration, pin_one_core_per_rank, write_results
from peers import _horovod_beside as horovod_peer

# kolo.torch, or horovod.torch in this script's Horovod run (the same calls).
hvd = horovod_peer.library()

OPS = ("allreduce", "adasum", "allgather", "broadcast", "alltoall", "reducescatter")
#: The ops Horovod is timed on (its Adasum needs MPI; this peer is built with gloo only).
HOROVOD_OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def bus_factor(op: str, n: int) -> float:
    if op in ("allreduce", "adasum"):
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


def elements_for(nbytes: int, dtype: torch.dtype, n: int) -> int:
    """Elements of S = ``nbytes``: at least one per rank, a multiple of ``n``."""
    itemsize = torch.tensor([], dtype=dtype).element_size()
    return max(n, nbytes // itemsize // n * n)


def library_call(op: str, nbytes: int, dtype: torch.dtype, n: int) -> Callable[[], Any]:
    """``hvd``'s call (kolo's, or Horovod's in the Horovod run) moving S = ``nbytes``."""
    elements = elements_for(nbytes, dtype, n)
    t = torch.ones(elements // n if op == "allgather" else elements, dtype=dtype)
    if op == "allreduce":
        return lambda: hvd.allreduce_(t, op=hvd.Sum, name="bench.op")
    if op == "adasum":
        # Equal tensors stay equal (Adasum averages parallel vectors): repeated calls are stable.
        return lambda: hvd.allreduce_(t, op=hvd.Adasum, name="bench.op")
    if op == "broadcast":
        return lambda: hvd.broadcast_(t, root_rank=0, name="bench.op")
    if op == "allgather":
        return lambda: hvd.allgather(t, name="bench.op")
    if op == "reducescatter":
        return lambda: hvd.reducescatter(t, op=hvd.Sum, name="bench.op")
    if op == "alltoall":
        return lambda: hvd.alltoall(t, name="bench.op")
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def gloo_call(op: str, nbytes: int, dtype: torch.dtype, n: int) -> Callable[[], Any]:
    """torch.distributed gloo's call moving S = ``nbytes`` (gloo has no Adasum: its Sum
    allreduce of the same tensor is the reference for ``adasum``)."""
    elements = elements_for(nbytes, dtype, n)
    t = torch.ones(elements, dtype=dtype)
    if op in ("allreduce", "adasum"):
        return lambda: dist.all_reduce(t, op=dist.ReduceOp.SUM)
    if op == "broadcast":
        return lambda: dist.broadcast(t, src=0)
    if op == "allgather":
        part, out = torch.ones(elements // n, dtype=dtype), torch.empty(elements, dtype=dtype)
        chunks, into_tensor = list(out.chunk(n)), [True]

        def allgather() -> None:
            if into_tensor[0]:
                try:
                    return dist.all_gather_into_tensor(out, part)
                except RuntimeError:  # torch < 2.2's gloo: "no support for _allgather_base"
                    into_tensor[0] = False
            dist.all_gather(chunks, part)

        return allgather
    if op == "reducescatter":
        out = torch.empty(elements // n, dtype=dtype)
        return lambda: dist.reduce_scatter_tensor(out, t, op=dist.ReduceOp.SUM)
    if op == "alltoall":
        out = torch.empty(elements, dtype=dtype)
        return lambda: dist.all_to_all_single(out, t)
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def two_memcpys(nbytes: int) -> Callable[[], Any]:
    """Each rank copies ``nbytes`` at the same time as the other: 2 concurrent memcpys."""
    src = torch.ones(max(1, nbytes), dtype=torch.uint8)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def probe(call: Callable[[], Any]) -> float:
    """Seconds per call from a warm-up call and 3 timed ones (every rank makes the same calls)."""
    call()
    start = time.perf_counter()
    for _ in range(3):
        call()
    return (time.perf_counter() - start) / 3


def agreed_calls(seconds_per_call: float, budget_s: float) -> int:
    local = torch.tensor([max(3, int(budget_s / max(seconds_per_call, 1e-9)))])
    return int(hvd.allreduce(local, op=hvd.Min, name="bench.calls").item())


def timed(call: Callable[[], Any], calls: int) -> float:
    """Seconds per call, the slowest rank's, after a barrier."""
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = torch.tensor([time.perf_counter() - start])
    return float(hvd.allreduce(elapsed, op=hvd.Max, name="bench.elapsed").item()) / calls


def use_transport(transport: str, current: list[str]) -> None:
    """Re-initializes kolo with ``KOLO_TRANSPORT=transport`` unless it already runs with it."""
    if current and current[0] == transport:
        return
    if current:
        hvd.shutdown()
    os.environ["KOLO_TRANSPORT"] = transport
    hvd.init()
    current[:] = [transport]


def figures(seconds: float, nbytes: int, factor: float) -> dict[str, float]:
    algbw = nbytes / seconds / 1e9
    return {"time_us": seconds * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * factor}


def csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 B, 4 KiB, 1 MiB, 64 MiB")
    parser.add_argument("--ops", type=csv, default=list(OPS))
    parser.add_argument("--dtypes", type=csv, default=list(DTYPES))
    parser.add_argument("--transports", type=csv, default=["auto", "tcp"])
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--step", type=int, default=4, help="size multiplier")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (quick 2)")
    parser.add_argument("--budget", type=float, default=None, help="s per timing (0.3; quick 0.05)")
    parser.add_argument("--json", type=Path, default=None)
    horovod_peer.add_arguments(parser)
    args = parser.parse_args()
    for name in args.ops:
        if name not in OPS:
            parser.error(f"--ops: unknown op {name!r}; choose from {', '.join(OPS)}")
    for name in args.dtypes:
        if name not in DTYPES:
            parser.error(f"--dtypes: unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.budget = args.budget or (0.05 if args.quick else 0.3)
    if args.quick:
        args.sizes = [8, 4 << 10, 1 << 20, 64 << 20]
    else:
        args.sizes, nbytes = [], args.min_bytes
        while nbytes <= args.max_bytes:
            args.sizes.append(nbytes)
            nbytes *= args.step
    return args


def horovod_main(args: argparse.Namespace) -> None:
    """This script's Horovod run (``--horovod-peer``, one size): every Horovod op and dtype
    of ``--ops``/``--dtypes`` timed as kolo's are; rank 0 hands back each one's seconds per
    call per round, or why Horovod cannot run it."""
    hvd.init()
    pin_one_core_per_rank(hvd.local_rank())
    (nbytes,) = args.sizes
    samples: dict[str, Any] = {}
    for op in [x for x in args.ops if x in HOROVOD_OPS]:
        for dtype_name in args.dtypes:
            key = f"{op}/{dtype_name}"
            try:
                call = library_call(op, nbytes, DTYPES[dtype_name], hvd.size())
                calls = agreed_calls(probe(call), args.budget)
            except ValueError as refused:  # e.g. "Tensor type torch.BFloat16Tensor is not
                samples[key] = {"error": str(refused)}  # supported." (on every rank)
                continue
            samples[key] = [timed(call, calls) for _ in range(args.rounds)]
    if hvd.rank() == 0:
        horovod_peer.emit_result({"samples": samples})
    hvd.shutdown()


def horovod_args(args: argparse.Namespace, nbytes: int) -> list[str]:
    """The Horovod run's arguments for one size (the same ops, dtypes, rounds, budget)."""
    return [
        *("--ops", ",".join(args.ops), "--dtypes", ",".join(args.dtypes)),
        *("--min-bytes", str(nbytes), "--max-bytes", str(nbytes)),
        *("--rounds", str(args.rounds), "--budget", str(args.budget)),
    ]


def main() -> None:
    args = parse_args()
    if args.horovod_peer:
        horovod_main(args)
        return
    rounds, budget, sizes = args.rounds, args.budget, args.sizes
    current: list[str] = []
    use_transport(args.transports[0], current)
    rank, size = hvd.rank(), hvd.size()
    peer_python = horovod_peer.peer_python(args.horovod, "collectives", announce=rank == 0)
    horovod: Optional[horovod_peer.HorovodBeside] = None
    if peer_python is not None:
        horovod = horovod_peer.HorovodBeside(hvd, peer_python, Path(__file__).resolve())
        if rank == 0:
            peer = horovod_peer.versions(peer_python)
            print(
                f"horovod {peer['horovod']} (torch {peer['torch']}) beside kolo "
                f"(torch {torch.__version__}), interleaved at every size",
                flush=True,
            )
    core = pin_one_core_per_rank()
    init_gloo()
    calibration = load_calibration() if rank == 0 else {}

    results: list[dict[str, Any]] = []
    for nbytes in sizes:
        samples: dict[tuple[str, str], dict[str, Any]] = {}
        for transport in args.transports:
            use_transport(transport, current)
            kolo_name = f"kolo_{transport}"
            for op in args.ops:
                for dtype_name in args.dtypes:
                    peers = {
                        kolo_name: library_call(op, nbytes, DTYPES[dtype_name], size),
                        "gloo": gloo_call(op, nbytes, DTYPES[dtype_name], size),
                    }
                    if op == "allreduce":
                        peers["memcpy2"] = two_memcpys(nbytes)
                    bucket = samples.setdefault((op, dtype_name), {})
                    try:
                        probe(peers["gloo"])
                    except RuntimeError as refused:  # e.g. torch 2.1's gloo: no reduce_scatter
                        bucket["gloo"] = {"error": str(refused)}  # (on every rank)
                        del peers["gloo"]
                    calls = {name: agreed_calls(probe(c), budget) for name, c in peers.items()}
                    for _ in range(rounds):
                        for name, call in peers.items():
                            bucket.setdefault(name, []).append(timed(call, calls[name]))
        if horovod is not None:
            # Right after kolo's timings of this size; kolo's ranks wait without a collective.
            theirs = horovod.run(horovod_args(args, nbytes), timeout=1800)
            for (op, dtype_name), bucket in samples.items():
                if "error" in theirs:
                    bucket["horovod"] = {"error": theirs["error"]}
                elif f"{op}/{dtype_name}" in theirs["samples"]:
                    bucket["horovod"] = theirs["samples"][f"{op}/{dtype_name}"]
        for (op, dtype_name), bucket in samples.items():
            row = make_row(op, dtype_name, nbytes, size, bucket, args.transports)
            results.append(row)
            if rank == 0:
                print_row(row, args.transports)

    if rank == 0:
        write_results(
            "collectives",
            {
                "ranks": size,
                "pinned_core_rank0": core,
                "transports": args.transports,
                "quick": args.quick,
                "rounds": rounds,
                "budget_s": budget,
                "horovod": None if peer_python is None else horovod_peer.versions(peer_python),
                "calibration": calibration,
                "results": results,
            },
            args.json,
        )
    if horovod is not None:
        horovod.close()
    dist.destroy_process_group()
    hvd.shutdown()


def make_row(
    op: str,
    dtype_name: str,
    nbytes: int,
    size: int,
    bucket: dict[str, Any],
    transports: list[str],
) -> dict[str, Any]:
    """One (op, dtype, size) result: each peer's median figures and kolo's ratios to them
    (``horovod`` is ``{"error": why}`` where Horovod could not run it)."""
    factor = bus_factor(op, size)
    row: dict[str, Any] = {"op": op, "dtype": dtype_name, "bytes": nbytes, "ranks": size}
    for name, times in bucket.items():
        row[name] = (
            dict(times)
            if isinstance(times, dict)
            else figures(statistics.median(times), nbytes, factor)
        )
    for transport in transports:
        kolo = row[f"kolo_{transport}"]
        if "busbw_GBps" in row["gloo"]:
            kolo["ratio_busbw_over_gloo"] = kolo["busbw_GBps"] / row["gloo"]["busbw_GBps"]
        if "busbw_GBps" in row.get("horovod", {}):
            kolo["ratio_busbw_over_horovod"] = kolo["busbw_GBps"] / row["horovod"]["busbw_GBps"]
        if "memcpy2" in row:
            kolo["ratio_time_over_2_memcpys"] = kolo["time_us"] / row["memcpy2"]["time_us"]
    return row


def print_row(row: dict[str, Any], transports: list[str]) -> None:
    parts = []
    for transport in transports:
        kolo = row[f"kolo_{transport}"]
        text = f"kolo[{transport}] {kolo['time_us']:10.1f} us busbw {kolo['busbw_GBps']:7.3f} GB/s"
        if "ratio_busbw_over_gloo" in kolo:
            text += f" {kolo['ratio_busbw_over_gloo']:6.2f}x gloo"
        if "ratio_busbw_over_horovod" in kolo:
            text += f" {kolo['ratio_busbw_over_horovod']:7.2f}x horovod"
        if "ratio_time_over_2_memcpys" in kolo:
            text += f" {kolo['ratio_time_over_2_memcpys']:6.2f}x 2memcpy"
        parts.append(text)
    gloo = row["gloo"]
    if "time_us" in gloo:
        parts.append(f"gloo {gloo['time_us']:10.1f} us busbw {gloo['busbw_GBps']:7.3f} GB/s")
    else:
        parts.append(f"gloo: {gloo['error'].splitlines()[0]}")
    horovod = row.get("horovod")
    if horovod is not None and "time_us" in horovod:
        parts.append(
            f"horovod {horovod['time_us']:10.1f} us busbw {horovod['busbw_GBps']:7.3f} GB/s"
        )
    elif horovod is not None:
        parts.append(f"horovod: {horovod['error'].splitlines()[0]}")
    if "memcpy2" in row:
        parts.append(f"2 memcpys {row['memcpy2']['time_us']:9.1f} us")
    print(f"{row['op']} {row['dtype']} {human(row['bytes']):>9}: " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
