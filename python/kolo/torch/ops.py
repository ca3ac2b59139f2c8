"""Horovod's PyTorch collectives, running on kolo's background engine.

Every op is submitted to the engine and returns a handle at once (``*_async``); the engine
agrees with the other ranks on what is ready, fuses small allreduces and runs them while
Python goes on. ``synchronize(handle)`` waits (without the GIL) and returns the result; the
synchronous ops are submit + synchronize. CPU tensors are used in place where possible; CUDA
tensors of allreduce and broadcast run through NCCL on their device when NCCL is found, the
rest are staged through pinned host memory (see docs/gpu.md). Ops are differentiable where
Horovod's are.

This module is the public surface; the pieces live in internal modules: ``_handles`` (submit,
the pending handles, ``poll``/``synchronize``), ``_buffers`` (dtypes, staging, results back
into tensors), ``_async_ops`` (the ``*_async`` ops) and ``_autograd`` (the gradients).

Example::

    h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum)
    total = hvd.synchronize(h)
    avg = hvd.allreduce(torch.ones(3))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch

from kolo import _core, _native
from kolo._core import resolve_op
from kolo.process_sets import global_process_set, resolve
from kolo.torch._async_ops import (
    _normalize_splits,
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
)
from kolo.torch._autograd import (
    _AllgatherFn,
    _allreduce,
    _AllreduceFn,
    _AlltoallFn,
    _BroadcastFn,
    _ReducescatterFn,
)
from kolo.torch._buffers import _plain_cpu, _require_dim
from kolo.torch._handles import (
    _allreduce_now,
    _submit,
    _synchronized,
    _waited_at_once,
    poll,
    synchronize,
)
from kolo.torch.compression import Compression

__all__ = [
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
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "synchronize",
]


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Reduces ``tensor`` across the ranks (Average by default); the input is not modified.

    Differentiable: the gradient is allreduced the same way.

    Example::

        avg = hvd.allreduce(torch.tensor([float(hvd.rank())]))  # mean of the ranks
        total = hvd.allreduce(torch.ones(3), op=hvd.Sum)         # == hvd.size() * ones
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    args = (_core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor, ps)
    if compressed.requires_grad and torch.is_grad_enabled():
        result = _AllreduceFn.apply(compressed, *args)
    else:
        result = _allreduce(compressed, *args)
    return compression.decompress(result, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """In-place :func:`allreduce`: ``tensor`` receives the result and is returned.

    Example::

        grad = torch.ones(4)
        hvd.allreduce_(grad, op=hvd.Sum)  # grad now holds size() in every element
    """
    if _plain_cpu(tensor):
        _core.require_initialized()
        return _allreduce_now(
            tensor,
            _core.op_name("allreduce", name),
            resolve_op(op, average),
            prescale_factor,
            postscale_factor,
            resolve(process_set),
        )
    return _synchronized(
        allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )


@_waited_at_once
def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """Allreduces several tensors as one fused operation; returns the results in order.

    Example::

        w_avg, b_avg = hvd.grouped_allreduce([w_grad, b_grad])
    """
    compressed = [compression.compress(t) for t in tensors]
    handle = grouped_allreduce_async(
        [c for c, _ in compressed],
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), compressed)]


@_waited_at_once
def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce`.

    Example::

        hvd.grouped_allreduce_([w_grad, b_grad])
    """
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order.

    Ranks may have different first dimensions (even 0); the other dimensions must agree.

    Example::

        rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), hvd.rank()))
    """
    _core.require_initialized()
    return _AllgatherFn.apply(tensor, _core.op_name("allgather", name), resolve(process_set))


@_waited_at_once
def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """Allgathers several tensors; returns the results in order.

    Example::

        a, b = hvd.grouped_allgather([x, y])
    """
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is not modified.

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    _core.require_initialized()
    return _BroadcastFn.apply(
        tensor, int(root_rank), _core.op_name("broadcast", name), resolve(process_set)
    )


@_waited_at_once
def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """In-place :func:`broadcast`: every rank's ``tensor`` receives ``root_rank``'s values.

    Example::

        hvd.broadcast_(param.data, root_rank=0)
    """
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall(
    tensor: torch.Tensor,
    splits: Union[Sequence[int], torch.Tensor, None] = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Sends ``splits[j]`` rows of ``tensor`` to rank ``j`` and gathers what every rank sent here.

    Without ``splits`` the first dimension is divided evenly and only the output is returned;
    with ``splits`` the result is ``(output, received_splits)`` as in Horovod.

    Example::

        out, received = hvd.alltoall(torch.arange(4.0), splits=[1, 3])  # on 2 ranks
    """
    _core.require_initialized()
    ps = resolve(process_set)
    _require_dim(tensor, "alltoall")
    normalized = _normalize_splits(splits, len(ps.ranks))
    output, received = _AlltoallFn.apply(tensor, normalized, _core.op_name("alltoall", name), ps)
    return output if splits is None else (output, received)


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduces ``tensor`` across ranks (Average by default) and gives each rank one slice of
    the first dimension: rank ``r`` gets ``rows // size`` rows, plus one if
    ``r < rows % size``.

    Example::

        part = hvd.reducescatter(torch.ones(4, 2), op=hvd.Sum)  # 2 rows each on 2 ranks
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, None)
    compressed, ctx = compression.compress(tensor)
    result = _ReducescatterFn.apply(
        compressed,
        _core.op_name("reducescatter", name),
        reduce_op,
        prescale_factor,
        postscale_factor,
        ps,
    )
    return compression.decompress(result, ctx)


@_waited_at_once
def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatters several tensors; returns this rank's part of each.

    Example::

        a, b = hvd.grouped_reducescatter([x, y], op=hvd.Sum)
    """
    compressed = [compression.compress(t) for t in tensors]
    handle = grouped_reducescatter_async(
        [c for c, _ in compressed], name, op, process_set, prescale_factor, postscale_factor
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), compressed)]


def join(device: int = -1) -> int:
    """Declares that this rank has no more data: until every rank joined, its engine takes part
    in the other ranks' allreduces with zeros (the identity), so ranks with fewer batches do not
    hang the others. Returns the last rank to join. ``device`` is accepted for Horovod
    compatibility.

    Example::

        for batch in my_batches:   # ranks may have different numbers of batches
            train_step(batch)
        hvd.join()
    """
    _core.require_initialized()
    return int(_native.wait(_native.join()))


@_waited_at_once
def barrier(process_set: Any = global_process_set) -> None:
    """Blocks until every rank of the process set has called ``barrier()``.

    Example::

        hvd.barrier()
    """
    _core.require_initialized()
    ps = resolve(process_set)
    _native.wait(
        _submit("barrier", _core.op_name("barrier", None), torch.empty(0, dtype=torch.uint8), ps)
    )
