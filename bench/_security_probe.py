"""One measurement process of bench/security_overhead.py (run under one build's PYTHONPATH).

python bench/_security_probe.py driver OUT.json
kolorun -np 2 python bench/_security_probe.py ranks OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path


def driver_figures() -> dict[str, float]:
    from kolo import _native

    driver = _native.LaunchDriver(1)
    os.environ.update(driver.worker_env(0))
    start = time.perf_counter()
    _native.session_join()
    join_ms = (time.perf_counter() - start) * 1e3
    for _ in range(200):
        _native.session_send(b"warm-up")
    times = []
    for _ in range(2000):
        start = time.perf_counter()
        _native.session_send(b"x" * 64)
        times.append(time.perf_counter() - start)
    _native.session_finish()
    driver.shutdown()
    return {"driver_call_us": statistics.median(times) * 1e6, "session_join_ms": join_ms}


def rank_figures() -> dict[str, float]:
    import torch

    import kolo.torch as hvd

    hvd.init()
    inits = []
    for _ in range(5):
        hvd.barrier()
        hvd.shutdown()
        start = time.perf_counter()
        hvd.init()
        inits.append(time.perf_counter() - start)
    figures = {"mesh_setup_ms": statistics.median(inits) * 1e3}
    for label, nbytes, calls in (
        ("allreduce_4KiB_us", 4 << 10, 2000),
        ("allreduce_64MiB_us", 64 << 20, 10),
    ):
        tensor = torch.ones(nbytes // 4)
        for _ in range(3):
            hvd.allreduce_(tensor, op=hvd.Sum, name="probe")
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            hvd.allreduce_(tensor, op=hvd.Sum, name="probe")
        elapsed = torch.tensor([time.perf_counter() - start])
        slowest = float(hvd.allreduce(elapsed, op=hvd.Max, name="probe.elapsed").item())
        figures[label] = slowest / calls * 1e6
    if hvd.rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(figures))
    hvd.shutdown()
    return figures


if __name__ == "__main__":
    if sys.argv[1] == "driver":
        Path(sys.argv[2]).write_text(json.dumps(driver_figures()))
    else:
        rank_figures()
