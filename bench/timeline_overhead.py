"""Timeline overhead: step time with the timeline recording vs off, interleaved in one job.

    kolorun -np 2 python bench/timeline_overhead.py [--tensors 200] [--bytes 4096]

Each step starts ``--tensors`` async allreduces of ``--bytes`` float32 bytes (fixed names) and
synchronizes them; many small tensors are the timeline's worst case (every tensor writes its
events). Rounds alternate between the timeline off and on (``hvd.start_timeline`` to a temp
file, ``hvd.stop_timeline`` after the round; rank 0 records), and the median step times give
the overhead ratio on / off. Writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import write_results

import kolo
import kolo.torch as hvd


def step(tensors: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    handles = [hvd.allreduce_async_(t, name=f"tl.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    tensors = [torch.ones(args.bytes // 4) for _ in range(args.tensors)]
    for _ in range(5):
        step(tensors)
    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for mode in order:
                if mode == "on":
                    hvd.start_timeline(os.path.join(tmp, f"timeline.{r}.json"))
                hvd.barrier()
                times[mode].extend(step(tensors) for _ in range(args.steps))
                if mode == "on":
                    hvd.stop_timeline()
        trace_bytes = sum(p.stat().st_size for p in Path(tmp).glob("*.json"))
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    if hvd.rank() == 0:
        print(
            f"timeline overhead ({args.tensors} x {args.bytes} B allreduces/step): "
            f"off {off * 1e3:.2f} ms, on {on * 1e3:.2f} ms, ratio on/off {on / off:.3f}"
        )
        write_results(
            "timeline_overhead",
            {
                "ranks": hvd.size(),
                "tensors": args.tensors,
                "bytes": args.bytes,
                "step_ms_off": off * 1e3,
                "step_ms_on": on * 1e3,
                "ratio_on_off": on / off,
                "trace_bytes": trace_bytes,
                "stats": kolo.engine_stats(),
            },
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
