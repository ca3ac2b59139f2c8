"""Rank 2 SIGSTOPs itself from a timer thread while every rank is inside allreduces: its process
(heartbeats included) freezes, so the other ranks' collectives time out; each prints the error
it raised and exits with 3. Every rank claims a host of its own (``simhost<task index>``), as
on three machines.

Arguments: a directory where each rank writes its pid (so the test can clean up the stopped one).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch

import kolo.torch as hvd
from kolo.exceptions import KoloError


def main() -> int:
    pid_dir = sys.argv[1]
    os.environ["KOLO_HOSTNAME"] = "simhost" + os.environ["KOLO_TASK_INDEX"]
    hvd.init()
    rank = hvd.rank()
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as pid_file:
        pid_file.write(str(os.getpid()))
    hvd.barrier()
    if rank == 2:

        def freeze() -> None:
            print(f"rank 2 SIGSTOPs itself at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

        threading.Timer(1.0, freeze).start()
    tensor = torch.ones(1024)
    start = time.time()
    try:
        while time.time() - start < 60:
            hvd.allreduce(tensor, op=hvd.Sum)
            time.sleep(0.01)
    except KoloError as err:
        message = str(err).replace("\n", " ")
        print(
            f"rank {rank} raised {type(err).__name__} at {time.time():.3f}: {message}", flush=True
        )
        # A failed rank exits non-zero, so kolorun stops the frozen one and ends the job.
        return 3
    print(f"rank {rank}: no error within 60 s", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
