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

from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch

from kolo import _core, _native
from kolo._core import resolve_op
from kolo.process_sets import global_process_set, resolve
from kolo.torch._async_ops import (
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
    HorovodAllgather,
    HorovodAllreduce,
    HorovodAlltoall,
    HorovodBroadcast,
    HorovodGroupedAllgather,
    HorovodGroupedAllreduce,
    HorovodGroupedReducescatter,
    HorovodReducescatter,
    _allreduce,
)
from kolo.torch._buffers import _plain_cpu
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
    "sparse_allreduce_async",
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
    compressed, ctx = compression.compress(tensor)
    if _tracks_grad(compressed):
        result = HorovodAllreduce.apply(
            compressed, average, name, op, prescale_factor, postscale_factor, process_set
        )
    else:
        result = _allreduce(
            compressed,
            _core.op_name("allreduce", name),
            resolve_op(op, average),
            prescale_factor,
            postscale_factor,
            resolve(process_set),
        )
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

    Differentiable like :func:`allreduce`: each gradient is allreduced the same way.

    Example::

        w_avg, b_avg = hvd.grouped_allreduce([w_grad, b_grad])
    """
    compressed = [compression.compress(t) for t in tensors]
    sent = [c for c, _ in compressed]
    if any(_tracks_grad(t) for t in sent):
        _core.require_initialized()
        results = HorovodGroupedAllreduce.apply(
            average, name, op, prescale_factor, postscale_factor, process_set, *sent
        )
    else:
        results = synchronize(
            grouped_allreduce_async(
                sent, average, name, op, prescale_factor, postscale_factor, process_set
            )
        )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


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


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str, op: Any, process_set: Any = global_process_set
) -> Callable[[], torch.Tensor]:
    """Starts the reduction of the sparse COO ``tensor`` as Horovod does: every rank's indices
    and values are allgathered (``<name>.indices``, ``<name>.values``), so the result holds
    every rank's entries (uncoalesced: entries at the same index add up). With ``op=hvd.Average``
    the values are divided by the process set's size.

    Returns a handle that is a function, as in Horovod: call it (or pass it to
    :func:`synchronize`) to wait for the result, a sparse tensor of ``tensor``'s size.

    Example::

        grad = torch.sparse_coo_tensor([[hvd.rank()]], [1.0], (4,))
        handle = hvd.sparse_allreduce_async(grad, name="emb.grad", op=hvd.Sum)
        total = handle()  # entries of every rank; total.to_dense()[:size] == 1
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, None)
    # Allgather concatenates along the first dimension: the indices travel as (nnz, sparse_dim).
    indices_handle = allgather_async(
        tensor._indices().transpose(0, 1).contiguous(), name=f"{name}.indices", process_set=ps
    )
    values_handle = allgather_async(tensor._values(), name=f"{name}.values", process_set=ps)

    def handle() -> torch.Tensor:
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if reduce_op == _core.Average:
            values = values / len(ps.ranks)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, tensor.size())

    return handle


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order.

    Ranks may have different first dimensions (even 0); the other dimensions must agree.
    Differentiable as in Horovod: the gradient is this rank's rows of the gradient averaged
    over the ranks.

    Example::

        rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), hvd.rank()))
    """
    _core.require_initialized()
    return HorovodAllgather.apply(tensor, name, process_set)


@_waited_at_once
def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """Allgathers several tensors; returns the results in order.

    Differentiable like :func:`allgather`.

    Example::

        a, b = hvd.grouped_allgather([x, y])
    """
    if any(_tracks_grad(t) for t in tensors):
        _core.require_initialized()
        return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is not modified.

    Differentiable as in Horovod: on ``root_rank`` the gradient is the gradient averaged over
    the ranks, on the other ranks zeros.

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    _core.require_initialized()
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


@_waited_at_once
def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """In-place :func:`broadcast`: every rank's ``tensor`` receives ``root_rank``'s values.

    Not differentiable (as in Horovod, where it writes into the tensor outside autograd); use
    :func:`broadcast` for a gradient.

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
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


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

    Differentiable as in Horovod: the gradient is every rank's gradient gathered, times
    ``size`` for Sum (times 1 for Average), times ``prescale_factor * postscale_factor``.

    Example::

        part = hvd.reducescatter(torch.ones(4, 2), op=hvd.Sum)  # 2 rows each on 2 ranks
    """
    _core.require_initialized()
    compressed, ctx = compression.compress(tensor)
    result = HorovodReducescatter.apply(
        compressed, name, op, process_set, prescale_factor, postscale_factor
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

    Differentiable like :func:`reducescatter`.

    Example::

        a, b = hvd.grouped_reducescatter([x, y], op=hvd.Sum)
    """
    compressed = [compression.compress(t) for t in tensors]
    sent = [c for c, _ in compressed]
    if any(_tracks_grad(t) for t in sent):
        _core.require_initialized()
        results = HorovodGroupedReducescatter.apply(
            name, op, process_set, prescale_factor, postscale_factor, *sent
        )
    else:
        results = synchronize(
            grouped_reducescatter_async(
                sent, name, op, process_set, prescale_factor, postscale_factor
            )
        )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


def _tracks_grad(tensor: Any) -> bool:
    """Whether an op on ``tensor`` must record a gradient (else the autograd node is skipped)."""
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


def join(device: int = -1) -> int:
    """Declares that this rank has no more data: until every rank joined, its engine takes part
    in the other ranks' allreduces with zeros (the identity) and in their barriers, so ranks
    with fewer batches do not hang the others. Returns the last rank to join (the same on every
    rank). ``device`` is accepted for Horovod compatibility.

    As in Horovod 0.28.1, the other collectives (allgather, broadcast, alltoall,
    reducescatter) cannot run while a rank has joined: the ranks that call one get a
    :class:`~kolo.exceptions.MismatchError` (a ``RuntimeError``), and then join too.

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
