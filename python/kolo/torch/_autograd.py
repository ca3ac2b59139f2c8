"""The differentiable collectives as ``torch.autograd.Function`` classes with Horovod's names,
``apply`` arguments and gradients (``horovod/torch/mpi_ops.py`` at 0.28.1), and the
synchronous implementations they run.

The gradients, as Horovod defines them:

- allreduce: the gradient allreduced with the same op and scale factors;
- allgather: this rank's rows of the gradient *averaged* over the ranks;
- broadcast: the gradient averaged over the ranks on the root rank, zeros elsewhere;
- alltoall: the gradient sent back where its rows came from;
- reducescatter: the gradients of every rank gathered, times ``size`` for Sum (times 1 for
  Average), times ``prescale_factor`` and ``postscale_factor``;
- the grouped forms: the single form's gradient for each tensor of the group.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from kolo import _core
from kolo._core import ReduceOp, resolve_op
from kolo.process_sets import ProcessSet, global_process_set, resolve
from kolo.torch._async_ops import (
    _normalize_splits,
    allgather_async,
    allreduce_async,
    alltoall_async,
    broadcast_async,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_reducescatter_async,
    reducescatter_async,
)
from kolo.torch._buffers import _require_dim
from kolo.torch._handles import _allreduce_now, _synchronized, _waited_at_once, synchronize

# --- raw synchronous implementations (the autograd functions use these) ----------------------


@_waited_at_once
def _allreduce(
    tensor: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    if isinstance(tensor, torch.Tensor) and tensor.is_cpu:
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        return _allreduce_now(out, name, op, prescale, postscale, resolve(process_set))
    return _synchronized(allreduce_async, tensor, None, name, op, prescale, postscale, process_set)


@_waited_at_once
def _allgather(
    tensor: torch.Tensor, name: str, process_set: Any = global_process_set
) -> torch.Tensor:
    return synchronize(allgather_async(tensor, name, process_set))


@_waited_at_once
def _alltoall(
    tensor: torch.Tensor,
    splits: Optional[list[int]],
    name: str,
    process_set: Any = global_process_set,
) -> tuple[torch.Tensor, torch.Tensor]:
    return synchronize(alltoall_async(tensor, splits, name, process_set))


@_waited_at_once
def _reducescatter(
    tensor: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale, postscale))


@_waited_at_once
def _grouped(submit: Any, *args: Any) -> tuple[torch.Tensor, ...]:
    return tuple(synchronize(submit(*args)))


def _grad_name(kind: str) -> str:
    return _core.op_name(f"{kind}.grad", None)


def _offset(rows: int, ps: ProcessSet) -> int:
    """The first row of this rank's part of an allgather of ``rows`` rows per rank."""
    counts = _allgather(torch.tensor([rows], dtype=torch.int64), _grad_name("allgather"), ps)
    return int(counts[: ps.rank()].sum().item())


def _reducescatter_grad_scale(op: ReduceOp, prescale: float, postscale: float, size: int) -> float:
    """Horovod's factor on a reducescatter's gathered gradient: ``size`` for Sum (1 for the
    other ops), times both scale factors."""
    scale = float(size) if op == _core.Sum else 1.0
    return scale * prescale * postscale


# --- autograd functions (Horovod's gradients) -------------------------------------------------


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce as an autograd function: ``HorovodAllreduce.apply(tensor, average, name, op,
    prescale_factor, postscale_factor, process_set)``; the gradient is allreduced the same way.

    Example::

        out = HorovodAllreduce.apply(x, None, "x", hvd.Sum, 1.0, 1.0, hvd.global_process_set)
    """

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):  # type: ignore[override]
        """Allreduces ``tensor`` (see :func:`kolo.torch.allreduce`)."""
        ctx.op, ctx.ps = resolve_op(op, average), resolve(process_set)
        ctx.prescale, ctx.postscale = prescale_factor, postscale_factor
        return _allreduce(
            tensor,
            _core.op_name("allreduce", name),
            ctx.op,
            prescale_factor,
            postscale_factor,
            ctx.ps,
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        """The gradient allreduced with the forward's op and scale factors."""
        grad = _allreduce(
            grad_output, _grad_name("allreduce"), ctx.op, ctx.prescale, ctx.postscale, ctx.ps
        )
        return grad, None, None, None, None, None, None


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce as an autograd function: ``HorovodGroupedAllreduce.apply(average,
    name, op, prescale_factor, postscale_factor, process_set, *tensors)``; each gradient is
    allreduced the same way.

    Example::

        a, b = HorovodGroupedAllreduce.apply(None, "g", hvd.Sum, 1.0, 1.0,
                                             hvd.global_process_set, x, y)
    """

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):  # type: ignore[override]
        """Allreduces ``tensors`` as one group (see :func:`kolo.torch.grouped_allreduce`)."""
        ctx.op, ctx.ps = resolve_op(op, average), resolve(process_set)
        ctx.prescale, ctx.postscale = prescale_factor, postscale_factor
        return _grouped(
            grouped_allreduce_async,
            list(tensors),
            None,
            name,
            ctx.op,
            prescale_factor,
            postscale_factor,
            ctx.ps,
        )

    @staticmethod
    def backward(ctx, *grad_outputs):  # type: ignore[override]
        """The gradients allreduced as one group with the forward's op and scale factors."""
        grads = _grouped(
            grouped_allreduce_async,
            list(grad_outputs),
            None,
            _grad_name("grouped_allreduce"),
            ctx.op,
            ctx.prescale,
            ctx.postscale,
            ctx.ps,
        )
        return (None, None, None, None, None, None, *grads)


class HorovodAllgather(torch.autograd.Function):
    """Allgather as an autograd function: ``HorovodAllgather.apply(tensor, name,
    process_set)``; the gradient is this rank's rows of the gradient averaged over the ranks.

    Example::

        rows = HorovodAllgather.apply(x, "x", hvd.global_process_set)
    """

    @staticmethod
    def forward(ctx, tensor, name, process_set):  # type: ignore[override]
        """Allgathers ``tensor`` (see :func:`kolo.torch.allgather`)."""
        _require_dim(tensor, "allgather")
        ctx.rows, ctx.ps = tensor.shape[0], resolve(process_set)
        return _allgather(tensor, _core.op_name("allgather", name), ctx.ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        """This rank's rows of the gradient averaged over the ranks."""
        grad = _allreduce(grad_output, _grad_name("allgather"), _core.Average, 1.0, 1.0, ctx.ps)
        return grad.narrow(0, _offset(ctx.rows, ctx.ps), ctx.rows), None, None


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather as an autograd function: ``HorovodGroupedAllgather.apply(name,
    process_set, *tensors)``; each gradient as :class:`HorovodAllgather`'s.

    Example::

        a, b = HorovodGroupedAllgather.apply("g", hvd.global_process_set, x, y)
    """

    @staticmethod
    def forward(ctx, name, process_set, *tensors):  # type: ignore[override]
        """Allgathers ``tensors`` (see :func:`kolo.torch.grouped_allgather`)."""
        for tensor in tensors:
            _require_dim(tensor, "grouped_allgather")
        ctx.rows, ctx.ps = [t.shape[0] for t in tensors], resolve(process_set)
        return _grouped(grouped_allgather_async, list(tensors), name, ctx.ps)

    @staticmethod
    def backward(ctx, *grad_outputs):  # type: ignore[override]
        """This rank's rows of each gradient averaged over the ranks."""
        grads = _grouped(
            grouped_allreduce_async,
            list(grad_outputs),
            None,
            _grad_name("grouped_allgather"),
            _core.Average,
            1.0,
            1.0,
            ctx.ps,
        )
        counts = _grouped(
            grouped_allgather_async,
            [torch.tensor([rows], dtype=torch.int64) for rows in ctx.rows],
            _grad_name("grouped_allgather.rows"),
            ctx.ps,
        )
        me = ctx.ps.rank()
        parts = [
            grad.narrow(0, int(count[:me].sum().item()), rows)
            for grad, count, rows in zip(grads, counts, ctx.rows)
        ]
        return (None, None, *parts)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast as an autograd function: ``HorovodBroadcast.apply(tensor, root_rank, name,
    process_set)``; the gradient is the gradient averaged over the ranks on ``root_rank`` and
    zeros on the other ranks.

    Example::

        w = HorovodBroadcast.apply(x, 0, "w", hvd.global_process_set)
    """

    @staticmethod
    @_waited_at_once
    def forward(ctx, tensor, root_rank, name, process_set):  # type: ignore[override]
        """Broadcasts ``tensor`` from ``root_rank`` (see :func:`kolo.torch.broadcast`)."""
        ctx.root_rank, ctx.ps = int(root_rank), resolve(process_set)
        return synchronize(
            broadcast_async(tensor, ctx.root_rank, _core.op_name("broadcast", name), ctx.ps)
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        """The gradient averaged over the ranks on the root rank, zeros elsewhere."""
        grad = _allreduce(grad_output, _grad_name("broadcast"), _core.Average, 1.0, 1.0, ctx.ps)
        if _core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall as an autograd function: ``HorovodAlltoall.apply(tensor, splits, name,
    process_set)`` returns the output, or ``(output, received_splits)`` when ``splits`` is
    given; the gradient goes back where its rows came from.

    Example::

        out, received = HorovodAlltoall.apply(x, [1, 3], "x", hvd.global_process_set)
    """

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # type: ignore[override]
        """Exchanges rows of ``tensor`` (see :func:`kolo.torch.alltoall`)."""
        ctx.ps = resolve(process_set)
        _require_dim(tensor, "alltoall")
        normalized = _normalize_splits(splits, len(ctx.ps.ranks))
        output, received = _alltoall(tensor, normalized, _core.op_name("alltoall", name), ctx.ps)
        ctx.received = received.tolist()
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *_dead):  # type: ignore[override]
        """The gradient's rows sent back to the ranks they came from."""
        grad, _ = _alltoall(grad_output, ctx.received, _grad_name("alltoall"), ctx.ps)
        return grad, None, None, None


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter as an autograd function: ``HorovodReducescatter.apply(tensor, name, op,
    process_set, prescale_factor, postscale_factor)``; the gradient is every rank's gradient
    gathered, times ``size`` for Sum, times both scale factors (Horovod's definition).

    Example::

        part = HorovodReducescatter.apply(x, "x", hvd.Sum, hvd.global_process_set, 1.0, 1.0)
    """

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):  # type: ignore[override]
        """Reduces ``tensor`` and keeps this rank's rows (see :func:`kolo.torch.reducescatter`)."""
        ctx.op, ctx.ps = resolve_op(op, None), resolve(process_set)
        ctx.prescale, ctx.postscale = prescale_factor, postscale_factor
        return _reducescatter(
            tensor,
            _core.op_name("reducescatter", name),
            ctx.op,
            prescale_factor,
            postscale_factor,
            ctx.ps,
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        """Every rank's gradient gathered, scaled as Horovod does."""
        scale = _reducescatter_grad_scale(ctx.op, ctx.prescale, ctx.postscale, len(ctx.ps.ranks))
        scaled = grad_output * scale if scale != 1.0 else grad_output
        grad = _allgather(scaled, _grad_name("reducescatter"), ctx.ps)
        return grad, None, None, None, None, None


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reducescatter as an autograd function: ``HorovodGroupedReducescatter.apply(name,
    op, process_set, prescale_factor, postscale_factor, *tensors)``; each gradient as
    :class:`HorovodReducescatter`'s.

    Example::

        a, b = HorovodGroupedReducescatter.apply("g", hvd.Sum, hvd.global_process_set,
                                                 1.0, 1.0, x, y)
    """

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):  # type: ignore[override]
        """Reducescatters ``tensors`` (see :func:`kolo.torch.grouped_reducescatter`)."""
        ctx.op, ctx.ps = resolve_op(op, None), resolve(process_set)
        ctx.prescale, ctx.postscale = prescale_factor, postscale_factor
        return _grouped(
            grouped_reducescatter_async,
            list(tensors),
            name,
            ctx.op,
            ctx.ps,
            prescale_factor,
            postscale_factor,
        )

    @staticmethod
    def backward(ctx, *grad_outputs):  # type: ignore[override]
        """Every rank's gradients gathered, scaled as Horovod does."""
        scale = _reducescatter_grad_scale(ctx.op, ctx.prescale, ctx.postscale, len(ctx.ps.ranks))
        scaled = [g * scale if scale != 1.0 else g for g in grad_outputs]
        grads = _grouped(
            grouped_allgather_async, scaled, _grad_name("grouped_reducescatter"), ctx.ps
        )
        return (None, None, None, None, None, *grads)
