"""Background engine costs: negotiation per tensor (response cache on and off) and fusion.

    python bench/engine.py [--np 2]            # runs both jobs below and combines them
    kolorun -np 2 python bench/engine.py       # one job, with the cache as configured

1. Negotiation: each step starts an in-place async allreduce of N tiny tensors (4 float32
   each, fixed names so the response cache can recognise them) and then synchronizes them
   all, for N = 10, 100, 1000. Reported per tensor: negotiation time =
   delta(engine_stats()['negotiation_ns']) / delta(engine_stats()['negotiated_tensors']),
   averaged over the ranks, and wall time = median step time / N; plus the share of cache
   hits and the engine cycles per step. negotiation_ns is the wall time of the agreement in
   every cycle that carried a tensor (idle cycles are not counted), including waiting for the
   other rank to reach its exchange, so the per-tensor figure is an upper bound on the
   engine's own cost. The response cache's
   capacity is read from ``KOLO_CACHE_CAPACITY`` when the engine starts, so "cache off" needs
   its own job: run plainly (no kolorun), this script launches ``kolorun -np 2`` jobs in
   turn -- as configured (cache on, both parts), then with ``--cache-capacity 0``
   (negotiation only), ``--repeats`` times -- and prints the medians side by side with the
   ratio off / on.
   Target: <= 5 us/tensor of negotiation with cache hits.
2. Fusion: each step reduces 256 float32 tensors of 16 KiB: kolo starts 256 async allreduces
   and then synchronizes them (the engine fuses them into few collectives); the peer,
   torch.distributed gloo in the same processes, runs one ``all_reduce`` per tensor. Timed
   alternately for several rounds (median); the ratio is gloo / kolo step time (target: >= 5).

Writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import init_gloo, write_results

COUNTERS = ("negotiation_ns", "negotiated_tensors", "cache_hits", "cache_misses", "cycles")


def cache_capacity() -> str:
    for name in ("KOLO_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    return "1024 (default)"


# --- worker (one rank of a kolorun job) -------------------------------------------------------


def run_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    import kolo
    import kolo.torch as hvd

    if not callable(getattr(kolo, "engine_stats", None)):
        raise SystemExit("bench/engine.py: this kolo build has no kolo.engine_stats()")
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.pin:
        try:
            os.sched_setaffinity(0, {hvd.local_rank() % os.cpu_count()})
        except (AttributeError, OSError):
            pass
    capacity = cache_capacity()

    def stats() -> dict[str, int]:
        counters = kolo.engine_stats()
        missing = [
            key for key in (*COUNTERS, "collectives", "fused_tensors") if key not in counters
        ]
        if missing:
            raise SystemExit(f"bench/engine.py: kolo.engine_stats() lacks {missing}: {counters}")
        return counters

    def mean_over_ranks(values: list[float]) -> list[float]:
        total = hvd.allreduce(
            torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name="bench.mean"
        )
        return [v / size for v in total.tolist()]

    def step_time_max(seconds: float) -> float:
        slowest = hvd.allreduce(torch.tensor([seconds]), op=hvd.Max, name="bench.elapsed")
        return float(slowest.item())

    payload: dict = {
        "ranks": size,
        "cache_capacity": capacity,
        "negotiation": [],
        "fusion": None,
    }

    for count in args.counts:
        tensors = [torch.zeros(4) for _ in range(count)]
        names = [f"bench.neg{count}.{i}" for i in range(count)]

        def step(tensors=tensors, names=names) -> None:
            handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
            for handle in handles:
                hvd.synchronize(handle)

        for _ in range(2):  # warm-up; the first step fills the response cache
            step()
        hvd.barrier()
        before = stats()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        after = stats()
        delta = mean_over_ranks([after[key] - before[key] for key in COUNTERS])
        wall = step_time_max(statistics.median(times))
        neg_ns, negotiated, hits, misses, cycles = delta
        row = {
            "tensors_per_step": count,
            "steps": args.steps,
            "negotiation_us_per_tensor": neg_ns / negotiated / 1000 if negotiated else None,
            "negotiated_tensors": negotiated,
            "cache_hit_share": hits / (hits + misses) if hits + misses else None,
            "cycles_per_step": cycles / args.steps,
            "negotiation_us_per_cycle": neg_ns / cycles / 1000 if cycles else None,
            "wall_us_per_tensor": wall / count * 1e6,
            "step_ms": wall * 1e3,
        }
        payload["negotiation"].append(row)
        if rank == 0:
            neg = row["negotiation_us_per_tensor"]
            hit = row["cache_hit_share"]
            print(
                f"negotiation {count:5d} tensors/step (cache capacity {capacity}): "
                f"{'n/a' if neg is None else f'{neg:8.2f}'} us/tensor negotiating, "
                f"{row['wall_us_per_tensor']:8.2f} us/tensor wall, "
                f"cache hits {'n/a' if hit is None else f'{hit:.0%}'}, "
                f"{row['cycles_per_step']:.1f} cycles/step",
                flush=True,
            )

    if not args.skip_fusion:
        init_gloo()
        tensors = [torch.zeros(args.fusion_bytes // 4) for _ in range(args.fusion_tensors)]
        names = [f"bench.fuse.{i}" for i in range(len(tensors))]

        def kolo_step() -> None:
            handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
            for handle in handles:
                hvd.synchronize(handle)

        def gloo_step() -> None:
            for t in tensors:
                dist.all_reduce(t, op=dist.ReduceOp.SUM)

        def timed(step) -> float:
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(args.fusion_steps):
                step()
            return step_time_max((time.perf_counter() - start) / args.fusion_steps)

        for step in (kolo_step, gloo_step):
            step()
        samples: dict[str, list[float]] = {"kolo": [], "gloo": []}
        fused = [0, 0, 0]  # tensors, fused_tensors, collectives during kolo's timings
        for _ in range(args.rounds):
            before = stats()
            samples["kolo"].append(timed(kolo_step))
            after = stats()
            for i, key in enumerate(("tensors", "fused_tensors", "collectives")):
                fused[i] += after.get(key, 0) - before.get(key, 0)
            samples["gloo"].append(timed(gloo_step))
        kolo_s = statistics.median(samples["kolo"])
        gloo_s = statistics.median(samples["gloo"])
        payload["fusion"] = {
            "tensors_per_step": len(tensors),
            "bytes_per_tensor": args.fusion_bytes,
            "kolo_step_ms": kolo_s * 1e3,
            "gloo_step_ms": gloo_s * 1e3,
            "kolo_samples_ms": [s * 1e3 for s in samples["kolo"]],
            "gloo_samples_ms": [s * 1e3 for s in samples["gloo"]],
            "ratio_gloo_over_kolo": gloo_s / kolo_s,
            "rank0_engine_delta": dict(zip(("tensors", "fused_tensors", "collectives"), fused)),
        }
        if rank == 0:
            print(
                f"fusion {len(tensors)} x {args.fusion_bytes // 1024} KiB fp32 allreduce/step: "
                f"kolo {kolo_s * 1e3:8.2f} ms (async + fused; {fused[1]} of {fused[0]} tensors "
                f"fused into {fused[2]} collectives) | gloo {gloo_s * 1e3:8.2f} ms "
                f"(one all_reduce per tensor) | ratio gloo/kolo {gloo_s / kolo_s:.2f}x",
                flush=True,
            )
        dist.destroy_process_group()

    if rank == 0:
        write_results("engine", payload, args.out)
    hvd.shutdown()


# --- driver (no kolorun: runs the two jobs and combines them) ---------------------------------


def kolorun_path() -> str:
    beside = Path(sys.executable).parent / "kolorun"
    found = str(beside) if beside.exists() else shutil.which("kolorun")
    if not found:
        raise SystemExit("bench/engine.py: kolorun is not on PATH; install kolo first")
    return found


def median_or_none(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def run_driver(args: argparse.Namespace) -> None:
    script = str(Path(__file__).resolve())
    common = ["--steps", str(args.steps), "--counts", *map(str, args.counts)]
    if args.pin:
        common.append("--pin")
    jobs = {
        "on": ([], [*common, "--rounds", str(args.rounds)]),
        "off": (["--cache-capacity", "0"], [*common, "--skip-fusion"]),
    }
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):  # on, off, on, off, ...: noise hits both alike
            for label, (flags, script_args) in jobs.items():
                out = Path(tmp) / f"{label}-{repeat}.json"
                command = [
                    kolorun_path(),
                    "-np",
                    str(args.np),
                    *flags,
                    sys.executable,
                    script,
                    *script_args,
                    "--out",
                    str(out),
                ]
                print(f"$ {' '.join(command)}", flush=True)
                code = subprocess.run(command, check=False).returncode
                if code != 0:
                    raise SystemExit(f"bench/engine.py: the cache-{label} job failed (exit {code})")
                runs[label].append(json.loads(out.read_text()))

    def us(value: float | None) -> str:
        return "n/a" if value is None else f"{value:8.2f}"

    print(f"summary (median of {args.repeats} job(s) per cache setting):", flush=True)
    combined = []
    for i, count in enumerate(args.counts):
        row: dict = {"tensors_per_step": count}
        for label in ("on", "off"):
            rows = [run["negotiation"][i] for run in runs[label]]
            row[label] = {
                key: median_or_none([r[key] for r in rows])
                for key in ("negotiation_us_per_tensor", "wall_us_per_tensor", "cache_hit_share")
            }
            row[label]["jobs"] = rows
        on, off = row["on"]["negotiation_us_per_tensor"], row["off"]["negotiation_us_per_tensor"]
        row["ratio_negotiation_off_over_on"] = off / on if on and off is not None else None
        combined.append(row)
        ratio = row["ratio_negotiation_off_over_on"]
        print(
            f"negotiation {count:5d} tensors/step: "
            f"cache on {us(on)} us/tensor (wall {us(row['on']['wall_us_per_tensor'])}) | "
            f"cache off {us(off)} us/tensor (wall {us(row['off']['wall_us_per_tensor'])}) | "
            f"ratio off/on {'n/a' if ratio is None else f'{ratio:.2f}x'}",
            flush=True,
        )
    fusions = [run["fusion"] for run in runs["on"] if run["fusion"]]
    fusion = None
    if fusions:
        kolo_ms = statistics.median(f["kolo_step_ms"] for f in fusions)
        gloo_ms = statistics.median(f["gloo_step_ms"] for f in fusions)
        fusion = {
            "tensors_per_step": fusions[0]["tensors_per_step"],
            "bytes_per_tensor": fusions[0]["bytes_per_tensor"],
            "kolo_step_ms": kolo_ms,
            "gloo_step_ms": gloo_ms,
            "ratio_gloo_over_kolo": gloo_ms / kolo_ms,
            "jobs": fusions,
        }
        print(
            f"fusion {fusion['tensors_per_step']} x {fusion['bytes_per_tensor'] // 1024} KiB: "
            f"kolo {kolo_ms:.2f} ms | gloo {gloo_ms:.2f} ms | "
            f"ratio gloo/kolo {gloo_ms / kolo_ms:.2f}x",
            flush=True,
        )
    first = runs["on"][0]
    payload = {"ranks": first["ranks"], "repeats": args.repeats}
    payload.update({"negotiation": combined, "fusion": fusion})
    write_results("engine", payload, args.out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--np", type=int, default=2, help="ranks (driver mode)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="driver mode: jobs per cache setting (median)"
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per tensor count")
    parser.add_argument("--rounds", type=int, default=5, help="fusion: alternating rounds")
    parser.add_argument("--fusion-steps", type=int, default=5, help="fusion: steps per round")
    parser.add_argument("--fusion-tensors", type=int, default=256)
    parser.add_argument("--fusion-bytes", type=int, default=16 << 10)
    parser.add_argument("--skip-fusion", action="store_true", help="negotiation part only")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin each rank to one core (off by default: on a shared machine a pinned rank "
        "cannot move away from a busy core, which slows small collectives many times over)",
    )
    args = parser.parse_args()
    if "KOLO_TASK_INDEX" in os.environ:
        run_worker(args)
    else:
        run_driver(args)


if __name__ == "__main__":
    main()
