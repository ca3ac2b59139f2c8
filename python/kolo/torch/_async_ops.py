"""Horovod's asynchronous collectives (``*_async``, ``grouped_*_async``): each hands its
tensors to the engine and returns a handle at once; ``synchronize(handle)`` returns the result.
Public as ``kolo.torch.ops.*`` and ``hvd.*``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch

from kolo import _core
from kolo._core import Adasum, ReduceOp, resolve_op
from kolo.exceptions import InvalidArgumentError, NotSupportedError
from kolo.process_sets import ProcessSet, global_process_set, resolve
from kolo.torch._buffers import (
    _device_or_owned,
    _device_or_staged,
    _from_bytes,
    _require_dim,
    _staged,
    _to_device,
    _write_back,
)
from kolo.torch._handles import _register, _register_group, _submit


def _allreduce_submit(
    buf: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    ps: ProcessSet,
) -> int:
    return _submit("allreduce", name, buf, ps, op=op, prescale=prescale, postscale=postscale)


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Starts an in-place allreduce of ``tensor`` (Average by default) and returns a handle;
    ``synchronize(handle)`` returns ``tensor`` holding the result.

    Example::

        h = hvd.allreduce_async_(grad, name="grad.0")
        ...  # overlap other work
        hvd.synchronize(h)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    staged = _device_or_staged(tensor, nccl=reduce_op is not Adasum)
    native = _allreduce_submit(
        staged, _core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor, ps
    )
    return _register([native], staged, lambda _: _write_back(tensor, staged))


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Starts an allreduce into a new tensor (the input is not modified); returns a handle.

    Example::

        h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum)
        total = hvd.synchronize(h)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    out = _device_or_owned(tensor, nccl=reduce_op is not Adasum)
    native = _allreduce_submit(
        out, _core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor, ps
    )
    return _register([native], out, lambda _: _to_device(out, tensor))


def _grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool],
    name: Optional[str],
    op: Any,
    prescale_factor: float,
    postscale_factor: float,
    process_set: Any,
    in_place: bool,
) -> int:
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("grouped ops need at least one tensor")
    base = _core.op_name("grouped_allreduce", name)
    nccl = reduce_op is not Adasum
    bufs = [_device_or_staged(t, nccl) if in_place else _device_or_owned(t, nccl) for t in tensors]
    with _core.submitted_together():
        natives = [
            _allreduce_submit(b, f"{base}.{i}", reduce_op, prescale_factor, postscale_factor, ps)
            for i, b in enumerate(bufs)
        ]
    if in_place:
        return _register(
            natives, bufs, lambda _: [_write_back(t, b) for t, b in zip(tensors, bufs)]
        )
    return _register(natives, bufs, lambda _: [_to_device(b, t) for t, b in zip(tensors, bufs)])


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Starts allreduces of several tensors, fused by the engine; one handle for the list.

    Example::

        h = hvd.grouped_allreduce_async([w_grad, b_grad])
        w_avg, b_avg = hvd.synchronize(h)
    """
    return _grouped_allreduce(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set, False
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """In-place :func:`grouped_allreduce_async`.

    Example::

        hvd.synchronize(hvd.grouped_allreduce_async_([w_grad, b_grad]))
    """
    return _grouped_allreduce(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set, True
    )


def _allgather_submit(tensor: torch.Tensor, name: str, ps: ProcessSet) -> tuple[int, Any, Any]:
    _require_dim(tensor, "allgather")
    src = _staged(tensor)
    native = _submit("allgather", name, src, ps)

    def finish(result: Any) -> torch.Tensor:
        data, rows = result
        return _to_device(_from_bytes(data, sum(rows), src), tensor)

    return native, src, finish


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set
) -> int:
    """Starts an allgather (concatenation along the first dimension, in rank order).

    Example::

        h = hvd.allgather_async(torch.ones(hvd.rank() + 1, 2))
        rows = hvd.synchronize(h)
    """
    _core.require_initialized()
    native, keep, finish = _allgather_submit(
        tensor, _core.op_name("allgather", name), resolve(process_set)
    )
    return _register([native], keep, lambda results: finish(results[0]))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts allgathers of several tensors; one handle for the list of results.

    Example::

        a, b = hvd.synchronize(hvd.grouped_allgather_async([x, y]))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    base = _core.op_name("grouped_allgather", name)
    with _core.submitted_together():
        parts = [_allgather_submit(t, f"{base}.{i}", ps) for i, t in enumerate(tensors)]
    return _register_group(parts)


def _broadcast_submit(buf: torch.Tensor, root_rank: int, name: str, ps: ProcessSet) -> int:
    root = int(root_rank)
    if ps.process_set_id != 0:
        if root not in ps.ranks:
            raise InvalidArgumentError(
                f"broadcast '{name}': root rank {root} is not in {ps!r}; root_rank is a global "
                "rank and must be a member of the process set"
            )
        root = ps.ranks.index(root)
    return _submit("broadcast", name, buf, ps, root=root)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts an in-place broadcast from global rank ``root_rank`` (a member of the set).

    Example::

        hvd.synchronize(hvd.broadcast_async_(param.data, root_rank=0))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    staged = _device_or_staged(tensor)
    native = _broadcast_submit(staged, root_rank, _core.op_name("broadcast", name), ps)
    return _register([native], staged, lambda _: _write_back(tensor, staged))


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts a broadcast from ``root_rank`` into a new tensor.

    Example::

        weights = hvd.synchronize(hvd.broadcast_async(weights, root_rank=0))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    out = _device_or_owned(tensor)
    native = _broadcast_submit(out, root_rank, _core.op_name("broadcast", name), ps)
    return _register([native], out, lambda _: _to_device(out, tensor))


def _even_splits(rows: int, world: int) -> list[int]:
    if rows % world != 0:
        raise InvalidArgumentError(
            f"alltoall without splits needs the first dimension ({rows}) to be divisible "
            f"by the number of ranks ({world}); pass splits= to send uneven parts"
        )
    return [rows // world] * world


def _normalize_splits(splits: Any, world: int) -> Optional[list[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            # Horovod refuses splits that are not integers (a ValueError), on every rank
            # alike, before anything is sent.
            raise InvalidArgumentError(
                f"alltoall splits must be a tensor of integers (torch.int32), got {splits.dtype}"
            )
        splits = splits.tolist()
    values = [int(s) for s in splits]
    if len(values) != world:
        raise InvalidArgumentError(
            f"alltoall splits has {len(values)} entries but the process set has {world} ranks; "
            "give one row count per rank"
        )
    if any(v < 0 for v in values):
        raise InvalidArgumentError(f"alltoall splits must not be negative, got {values}")
    return values


def alltoall_async(
    tensor: torch.Tensor,
    splits: Union[Sequence[int], torch.Tensor, None] = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts an alltoall; ``synchronize`` returns ``(output, received_splits)``.

    Example::

        out, received = hvd.synchronize(hvd.alltoall_async(x, splits=[1, 3]))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    _require_dim(tensor, "alltoall")
    world = len(ps.ranks)
    src = _staged(tensor)
    chosen = _normalize_splits(splits, world) or _even_splits(src.shape[0], world)
    native = _submit("alltoall", _core.op_name("alltoall", name), src, ps, splits=chosen)

    def finish(results: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        data, rows = results[0]
        output = _to_device(_from_bytes(data, sum(rows), src), tensor)
        return output, torch.tensor(rows, dtype=torch.int32)

    return _register([native], src, finish)


def _reducescatter_submit(
    tensor: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    ps: ProcessSet,
) -> tuple[int, Any, Any]:
    _require_dim(tensor, "reducescatter")
    if op is Adasum:  # Horovod raises a RuntimeError; NotSupportedError is one
        raise NotSupportedError(
            "reducescatter does not support op=hvd.Adasum; use hvd.Sum or hvd.Average"
        )
    src = _staged(tensor)
    native = _submit("reducescatter", name, src, ps, op=op, prescale=prescale, postscale=postscale)
    me = ps.rank()

    def finish(result: Any) -> torch.Tensor:
        data, rows = result
        return _to_device(_from_bytes(data, rows[me], src), tensor)

    return native, src, finish


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Starts a reducescatter (Average by default); ``synchronize`` returns this rank's rows.

    Example::

        part = hvd.synchronize(hvd.reducescatter_async(torch.ones(4, 2), op=hvd.Sum))
    """
    _core.require_initialized()
    native, keep, finish = _reducescatter_submit(
        tensor,
        _core.op_name("reducescatter", name),
        resolve_op(op, None),
        prescale_factor,
        postscale_factor,
        resolve(process_set),
    )
    return _register([native], keep, lambda results: finish(results[0]))


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Starts reducescatters of several tensors; one handle for the list of results.

    Example::

        a, b = hvd.synchronize(hvd.grouped_reducescatter_async([x, y], op=hvd.Sum))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, None)
    base = _core.op_name("grouped_reducescatter", name)
    with _core.submitted_together():
        parts = [
            _reducescatter_submit(
                t, f"{base}.{i}", reduce_op, prescale_factor, postscale_factor, ps
            )
            for i, t in enumerate(tensors)
        ]
    return _register_group(parts)
