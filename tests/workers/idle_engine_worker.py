"""Counts the engine cycles each rank runs, and the CPU time its engine thread uses, while
every rank sleeps for half a second after a warm-up allreduce (nothing submitted anywhere).
Prints ``IDLE cycles=<n> engine_cpu_ms=<ms>``."""

import os
import time
from pathlib import Path

import torch

import kolo
import kolo.torch as hvd


def engine_cpu_ns() -> int:
    """Nanoseconds the ``kolo-engine`` thread has run (``/proc``'s schedstat)."""
    for task in Path("/proc/self/task").iterdir():
        if (task / "comm").read_text().strip() == "kolo-engine":
            return int((task / "schedstat").read_text().split()[0])
    raise RuntimeError("no kolo-engine thread")


hvd.init()
assert torch.equal(hvd.allreduce(torch.ones(4), op=hvd.Sum), torch.full((4,), hvd.size() * 1.0))
hvd.barrier()
time.sleep(0.05)  # the cycle of the barrier ends everywhere
cycles, cpu = kolo.engine_stats()["cycles"], engine_cpu_ns()
time.sleep(0.5)
idle_cycles = kolo.engine_stats()["cycles"] - cycles
idle_cpu_ms = (engine_cpu_ns() - cpu) / 1e6
print(f"IDLE cycles={idle_cycles} engine_cpu_ms={idle_cpu_ms:.2f} pid={os.getpid()}", flush=True)
hvd.barrier()
hvd.shutdown()
