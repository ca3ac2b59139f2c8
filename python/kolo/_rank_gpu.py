"""The GPU a rank trains on, as its launcher assigned it: the launcher-neutral contract between a
launcher and the code that runs in its ranks.

A launcher that knows which GPUs a rank's task owns (``kolo.spark.run``: the Spark task's
``gpu`` resources) puts their addresses into the rank's environment as
:data:`GPU_ADDRESSES_VAR`; the code in the rank (the estimator core's trainers, the Lightning
strategy) calls :func:`rank_gpu_index` and never imports the launcher. Without an assignment
(``kolorun``, ``RayExecutor`` — which orders each node's ``CUDA_VISIBLE_DEVICES`` so that it
is right — or no GPUs) the rank's GPU is its ``local_rank``; so it is, as in Horovod, when
``KOLO_SPARK_USE_LOCAL_RANK_GPU_INDEX`` (or ``HOROVOD_SPARK_USE_LOCAL_RANK_GPU_INDEX``) is set
to anything but ``0``.

Example::

    import torch
    from kolo._rank_gpu import rank_gpu_index

    torch.cuda.set_device(rank_gpu_index(hvd.local_rank()))
"""

from __future__ import annotations

import logging
import os
from typing import List, Optional

__all__ = ["GPU_ADDRESSES_VAR", "LOCAL_RANK_GPU_VARS", "assigned_gpus", "rank_gpu_index"]

log = logging.getLogger(__name__)

#: The comma-separated GPU addresses a launcher assigned to the rank (empty: none).
GPU_ADDRESSES_VAR = "KOLO_GPU_ADDRESSES"

#: Set to anything but ``0``, the rank trains on GPU ``local_rank`` whatever was assigned
#: (Horovod's ``HOROVOD_SPARK_USE_LOCAL_RANK_GPU_INDEX``).
LOCAL_RANK_GPU_VARS = (
    "KOLO_SPARK_USE_LOCAL_RANK_GPU_INDEX",
    "HOROVOD_SPARK_USE_LOCAL_RANK_GPU_INDEX",
)


def assigned_gpus() -> Optional[List[str]]:
    """The GPU addresses the launcher assigned to this rank, or ``None`` when it assigned none
    (the variable is unset); an empty list when it said the rank has none.

    Example::

        assigned_gpus()   # ["1"] for a Spark task that owns GPU 1
    """
    value = os.environ.get(GPU_ADDRESSES_VAR)
    if value is None:
        return None
    return [address for address in value.split(",") if address]


def rank_gpu_index(local_rank: int) -> int:
    """The index of the GPU this rank trains on: the first address its launcher assigned,
    else (or with :data:`LOCAL_RANK_GPU_VARS` set to anything but ``0``) ``local_rank``.

    Example::

        rank_gpu_index(0)   # 0 without an assignment
    """
    if any(os.environ.get(name, "0") != "0" for name in LOCAL_RANK_GPU_VARS):
        return local_rank
    addresses = assigned_gpus()
    if addresses:
        try:
            return int(addresses[0])
        except ValueError:
            log.debug("GPU address %r is not an index; using local_rank", addresses[0])
    return local_rank
