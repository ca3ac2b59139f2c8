"""A rank started by mpirun or srun that meets the others without mpi4py's help (MASTER_ADDR,
MASTER_PORT and KOLO_JOB_SECRET from the environment): prints its rank next to the launcher's,
and an allreduce over the job."""

from __future__ import annotations

import os

import kolo.torch as hvd

hvd.init()
import torch  # noqa: E402  (after init: a failing init reports before torch loads)

launcher_rank = next(
    os.environ[name]
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
    if name in os.environ
)
total = int(hvd.allreduce(torch.tensor([hvd.rank() + 1]), op=hvd.Sum).item())
secret_left = "KOLO_JOB_SECRET" in os.environ and "KOLO_DRIVER_ADDR" in os.environ
print(
    f"launcher rank {launcher_rank}: rank {hvd.rank()} of {hvd.size()}, local "
    f"{hvd.local_rank()} of {hvd.local_size()}, sum {total}, job vars left {secret_left}",
    flush=True,
)
hvd.shutdown()
