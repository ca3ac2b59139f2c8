"""Rank 1 SIGKILLs itself from a timer thread while the main thread is inside allreduces; the
other ranks must raise a kolo InternalError (JobAbortedError or PeerConnectionError) quickly.

Arguments: a directory where each rank writes its pid (so the test can check none survive).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

import kolo.torch as hvd
from kolo.exceptions import InternalError


def main() -> int:
    pid_dir = sys.argv[1]
    hvd.init()
    rank = hvd.rank()
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as pid_file:
        pid_file.write(str(os.getpid()))
    hvd.barrier()
    if rank == 1:

        def die() -> None:
            print(f"rank 1 SIGKILLs itself at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(1.0, die).start()
    tensor = torch.ones(2 * 1024 * 1024)
    start = time.time()
    try:
        while time.time() - start < 60:
            hvd.allreduce(tensor, op=hvd.Sum)
    except InternalError as err:
        print(f"rank {rank} raised {type(err).__name__} at {time.time():.3f}: {err}", flush=True)
        return 0
    print(f"rank {rank}: no error within 60 s", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
