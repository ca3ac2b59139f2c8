"""Horovod's PyTorch API on kolo: ``import kolo.torch as hvd``.

Example::

    import torch
    import kolo.torch as hvd

    hvd.init()
    grad = hvd.allreduce(torch.ones(3))  # averaged over all ranks
    if hvd.rank() == 0:
        print("ranks:", hvd.size())
"""

from kolo._core import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from kolo.exceptions import HorovodInternalError
from kolo.torch.compression import Compression
from kolo.torch.functions import allgather_object, broadcast_object
from kolo.torch.ops import (
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    reducescatter,
)

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "rocm_built",
    "shutdown",
    "size",
]
