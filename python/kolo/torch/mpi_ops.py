"""Horovod's ``horovod.torch.mpi_ops`` path: every public name of that module at 0.28.1,
importable from ``kolo.torch.mpi_ops`` and bound to kolo's implementations (the same objects
``kolo.torch`` exports), for scripts that import from it directly.

The autograd functions keep Horovod's names and ``apply`` arguments
(``HorovodAllreduce.apply(tensor, average, name, op, prescale_factor, postscale_factor,
process_set)``, ...). Horovod's build helpers imported there (``check_installed_version``,
``gpu_available``, ``num_rank_is_power_2``, ``mpi_lib``) are not collectives and are not
provided.

Example::

    from kolo.torch.mpi_ops import allreduce, Sum

    total = allreduce(torch.ones(3), op=Sum)
"""

from typing import Any, Optional

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
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    resolve_op,
    rocm_built,
    size,
    start_timeline,
    stop_timeline,
)
from kolo._lifecycle import init, shutdown
from kolo.exceptions import HorovodInternalError
from kolo.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from kolo.torch._autograd import (
    HorovodAllgather,
    HorovodAllreduce,
    HorovodAlltoall,
    HorovodBroadcast,
    HorovodGroupedAllgather,
    HorovodGroupedAllreduce,
    HorovodGroupedReducescatter,
    HorovodReducescatter,
)
from kolo.torch.compression import Compression
from kolo.torch.ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)


def handle_average_backwards_compatibility(op: Any, average: Optional[bool]) -> ReduceOp:
    """Horovod's rule for the deprecated ``average=`` flag: ``op`` wins, ``average`` maps to
    Average/Sum (with a DeprecationWarning), both at once is a ``ValueError``, and the default
    is Average.

    Example::

        handle_average_backwards_compatibility(None, False)  # Sum
    """
    return resolve_op(op, average)


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "HorovodAllgather",
    "HorovodAllreduce",
    "HorovodAlltoall",
    "HorovodBroadcast",
    "HorovodGroupedAllgather",
    "HorovodGroupedAllreduce",
    "HorovodGroupedReducescatter",
    "HorovodInternalError",
    "HorovodReducescatter",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "handle_average_backwards_compatibility",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
