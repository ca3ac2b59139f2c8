"""The differentiable collectives as ``torch.autograd.Function`` classes with Horovod's
gradients (an allreduce's gradient is allreduced the same way, an allgather's is this rank's
slice of the summed gradient, ...), and the synchronous implementations they run."""

from __future__ import annotations

from typing import Any, Optional

import torch

from kolo import _core
from kolo._core import ReduceOp
from kolo.process_sets import global_process_set, resolve
from kolo.torch._async_ops import (
    allgather_async,
    allreduce_async,
    alltoall_async,
    broadcast_async,
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


# --- autograd functions (Horovod's gradients) -------------------------------------------------


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, ps):  # type: ignore[override]
        ctx.op, ctx.prescale, ctx.postscale, ctx.ps = op, prescale, postscale, ps
        return _allreduce(tensor, name, op, prescale, postscale, ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output,
            _core.op_name("allreduce.grad", None),
            ctx.op,
            ctx.prescale,
            ctx.postscale,
            ctx.ps,
        )
        return grad, None, None, None, None, None


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):  # type: ignore[override]
        _require_dim(tensor, "allgather")
        ctx.rows, ctx.ps = tensor.shape[0], ps
        return _allgather(tensor, name, ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output, _core.op_name("allgather.grad", None), _core.Sum, 1.0, 1.0, ctx.ps
        )
        rows = _allgather(
            torch.tensor([ctx.rows], dtype=torch.int64),
            _core.op_name("allgather.grad", None),
            ctx.ps,
        )
        offset = int(rows[: ctx.ps.rank()].sum().item())
        return grad.narrow(0, offset, ctx.rows), None, None


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    @_waited_at_once
    def forward(ctx, tensor, root_rank, name, ps):  # type: ignore[override]
        ctx.root_rank, ctx.ps = root_rank, ps
        return synchronize(broadcast_async(tensor, root_rank, name, ps))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output, _core.op_name("broadcast.grad", None), _core.Sum, 1.0, 1.0, ctx.ps
        )
        if _core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):  # type: ignore[override]
        output, received = _alltoall(tensor, splits, name, ps)
        ctx.received, ctx.ps = received.tolist(), ps
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):  # type: ignore[override]
        grad, _ = _alltoall(grad_output, ctx.received, _core.op_name("alltoall.grad", None), ctx.ps)
        return grad, None, None, None


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, ps):  # type: ignore[override]
        ctx.op, ctx.prescale, ctx.postscale, ctx.ps = op, prescale, postscale, ps
        return _reducescatter(tensor, name, op, prescale, postscale, ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allgather(grad_output, _core.op_name("reducescatter.grad", None), ctx.ps)
        scale = ctx.prescale * ctx.postscale
        if ctx.op == _core.Average:
            scale /= len(ctx.ps.ranks)
        return grad * scale if scale != 1.0 else grad, None, None, None, None, None
