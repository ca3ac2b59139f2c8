"""Horovod's PyTorch collectives, running on kolo's Rust runtime.

Every call is synchronous for now and releases the GIL while Rust works. CPU tensors are used
in place where possible; CUDA tensors are staged through host memory (NCCL arrives with the GPU
work). Ops are differentiable where Horovod's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch

from kolo import _core, _native
from kolo._core import ReduceOp, resolve_op
from kolo.exceptions import InvalidArgumentError
from kolo.torch.compression import Compression

_DTYPE_NAMES = {
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bool: "bool",
}


def _dtype_name(tensor: torch.Tensor) -> str:
    try:
        return _DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"tensors of dtype {tensor.dtype} are not supported; convert to one of "
            f"{', '.join(str(d) for d in _DTYPE_NAMES)}"
        ) from None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _staged(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s values (`tensor` itself when it already is one)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor.detach().cpu().contiguous()


def _owned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s values that shares no memory with it."""
    staged = _staged(tensor)
    return staged.clone() if staged.data_ptr() == tensor.data_ptr() else staged


def _require_dim(tensor: torch.Tensor, what: str) -> None:
    if tensor.dim() == 0:
        raise InvalidArgumentError(
            f"{what} works on the first dimension, but got a 0-dim tensor; use "
            "tensor.reshape(1) (or unsqueeze(0)) first"
        )


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return result if like.device.type == "cpu" else result.to(like.device)


def _write_back(target: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
    if staged.data_ptr() != target.data_ptr():
        with torch.no_grad():
            target.copy_(staged)
    return target


# --- raw (non-autograd) implementations -------------------------------------------------------


def _allreduce_inplace(
    buf: torch.Tensor, name: str, op: ReduceOp, prescale: float, postscale: float
) -> None:
    _native.allreduce(
        buf.data_ptr(),
        _nbytes(buf),
        list(buf.shape),
        _dtype_name(buf),
        op.name,
        float(prescale),
        float(postscale),
        name,
    )


def _allreduce(
    tensor: torch.Tensor, name: str, op: ReduceOp, prescale: float, postscale: float
) -> torch.Tensor:
    out = _owned_copy(tensor)
    _allreduce_inplace(out, name, op, prescale, postscale)
    return _to_device(out, tensor)


def _allgather(tensor: torch.Tensor, name: str) -> torch.Tensor:
    _require_dim(tensor, "allgather")
    src = _staged(tensor)
    outputs: list[torch.Tensor] = []

    def alloc(first_dims: list[int]) -> tuple[int, int]:
        out = torch.empty((sum(first_dims), *src.shape[1:]), dtype=src.dtype)
        outputs.append(out)
        return out.data_ptr(), _nbytes(out)

    _native.allgather(src.data_ptr(), _nbytes(src), list(src.shape), _dtype_name(src), name, alloc)
    return _to_device(outputs[0], tensor)


def _broadcast_inplace(buf: torch.Tensor, root_rank: int, name: str) -> None:
    _native.broadcast(
        buf.data_ptr(), _nbytes(buf), list(buf.shape), _dtype_name(buf), int(root_rank), name
    )


def _alltoall(
    tensor: torch.Tensor, splits: Optional[list[int]], name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    _require_dim(tensor, "alltoall")
    src = _staged(tensor)
    world = _core.size()
    rows = src.shape[0]
    if splits is None:
        if rows % world != 0:
            raise InvalidArgumentError(
                f"alltoall without splits needs the first dimension ({rows}) to be divisible "
                f"by the number of ranks ({world}); pass splits= to send uneven parts"
            )
        splits = [rows // world] * world
    outputs: list[torch.Tensor] = []

    def alloc(recv_splits: list[int]) -> tuple[int, int]:
        out = torch.empty((sum(recv_splits), *src.shape[1:]), dtype=src.dtype)
        outputs.append(out)
        return out.data_ptr(), _nbytes(out)

    received = _native.alltoall(
        src.data_ptr(), _nbytes(src), list(src.shape), _dtype_name(src), splits, name, alloc
    )
    return _to_device(outputs[0], tensor), torch.tensor(received, dtype=torch.int32)


def _reducescatter_rows(rows: int, world: int, rank: int) -> int:
    return rows // world + (1 if rank < rows % world else 0)


def _reducescatter(
    tensor: torch.Tensor, name: str, op: ReduceOp, prescale: float, postscale: float
) -> torch.Tensor:
    _require_dim(tensor, "reducescatter")
    src = _staged(tensor)
    rows = _reducescatter_rows(src.shape[0], _core.size(), _core.rank())
    out = torch.empty((rows, *src.shape[1:]), dtype=src.dtype)
    _native.reducescatter(
        src.data_ptr(),
        _nbytes(src),
        out.data_ptr(),
        _nbytes(out),
        list(src.shape),
        _dtype_name(src),
        op.name,
        float(prescale),
        float(postscale),
        name,
    )
    return _to_device(out, tensor)


def _normalize_splits(splits: Any) -> Optional[list[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    values = [int(s) for s in splits]
    if len(values) != _core.size():
        raise InvalidArgumentError(
            f"alltoall splits has {len(values)} entries but the job has {_core.size()} ranks; "
            "give one row count per rank"
        )
    if any(v < 0 for v in values):
        raise InvalidArgumentError(f"alltoall splits must not be negative, got {values}")
    return values


# --- autograd functions (Horovod's gradients) -------------------------------------------------


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale):  # type: ignore[override]
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return _allreduce(tensor, name, op, prescale, postscale)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output, _core.op_name("allreduce.grad", None), ctx.op, ctx.prescale, ctx.postscale
        )
        return grad, None, None, None, None


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):  # type: ignore[override]
        _require_dim(tensor, "allgather")
        ctx.rows = tensor.shape[0]
        return _allgather(tensor, name)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(grad_output, _core.op_name("allgather.grad", None), _core.Sum, 1.0, 1.0)
        rows = _allgather(
            torch.tensor([ctx.rows], dtype=torch.int64), _core.op_name("allgather.grad", None)
        )
        offset = int(rows[: _core.rank()].sum().item())
        return grad.narrow(0, offset, ctx.rows), None


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):  # type: ignore[override]
        ctx.root_rank = root_rank
        out = _owned_copy(tensor)
        _broadcast_inplace(out, root_rank, name)
        return _to_device(out, tensor)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(grad_output, _core.op_name("broadcast.grad", None), _core.Sum, 1.0, 1.0)
        if _core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name):  # type: ignore[override]
        output, received = _alltoall(tensor, splits, name)
        ctx.received = received.tolist()
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):  # type: ignore[override]
        grad, _ = _alltoall(grad_output, ctx.received, _core.op_name("alltoall.grad", None))
        return grad, None, None


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale):  # type: ignore[override]
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return _reducescatter(tensor, name, op, prescale, postscale)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allgather(grad_output, _core.op_name("reducescatter.grad", None))
        scale = ctx.prescale * ctx.postscale
        if ctx.op == _core.Average:
            scale /= _core.size()
        return grad * scale if scale != 1.0 else grad, None, None, None, None


# --- public API -------------------------------------------------------------------------------


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> torch.Tensor:
    """Reduces ``tensor`` across all ranks (Average by default); the input is not modified.

    Differentiable: the gradient is allreduced the same way.

    Example::

        avg = hvd.allreduce(torch.tensor([float(hvd.rank())]))  # mean of the ranks
        total = hvd.allreduce(torch.ones(3), op=hvd.Sum)         # == hvd.size() * ones
    """
    _check_process_set(process_set)
    _core.require_initialized()
    reduce_op = resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    result = _AllreduceFn.apply(
        compressed,
        _core.op_name("allreduce", name),
        reduce_op,
        prescale_factor,
        postscale_factor,
    )
    return compression.decompress(result, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> torch.Tensor:
    """In-place :func:`allreduce`: ``tensor`` receives the result and is returned.

    Example::

        grad = torch.ones(4)
        hvd.allreduce_(grad, op=hvd.Sum)  # grad now holds size() in every element
    """
    _check_process_set(process_set)
    _core.require_initialized()
    reduce_op = resolve_op(op, average)
    staged = _staged(tensor)
    _allreduce_inplace(
        staged, _core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor
    )
    return _write_back(tensor, staged)


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None
) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order.

    Ranks may have different first dimensions (even 0); the other dimensions must agree.

    Example::

        rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), hvd.rank()))
    """
    _check_process_set(process_set)
    _core.require_initialized()
    return _AllgatherFn.apply(tensor, _core.op_name("allgather", name))


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is not modified.

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    _check_process_set(process_set)
    _core.require_initialized()
    return _BroadcastFn.apply(tensor, int(root_rank), _core.op_name("broadcast", name))


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: Any = None
) -> torch.Tensor:
    """In-place :func:`broadcast`: every rank's ``tensor`` receives ``root_rank``'s values.

    Example::

        hvd.broadcast_(param.data, root_rank=0)
    """
    _check_process_set(process_set)
    _core.require_initialized()
    staged = _staged(tensor)
    _broadcast_inplace(staged, int(root_rank), _core.op_name("broadcast", name))
    return _write_back(tensor, staged)


def alltoall(
    tensor: torch.Tensor,
    splits: Union[Sequence[int], torch.Tensor, None] = None,
    name: Optional[str] = None,
    process_set: Any = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Sends ``splits[j]`` rows of ``tensor`` to rank ``j`` and gathers what every rank sent here.

    Without ``splits`` the first dimension is divided evenly and only the output is returned;
    with ``splits`` the result is ``(output, received_splits)`` as in Horovod.

    Example::

        out, received = hvd.alltoall(torch.arange(4.0), splits=[1, 3])  # on 2 ranks
    """
    _check_process_set(process_set)
    _core.require_initialized()
    normalized = _normalize_splits(splits)
    output, received = _AlltoallFn.apply(tensor, normalized, _core.op_name("alltoall", name))
    return output if splits is None else (output, received)


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduces ``tensor`` across ranks (Average by default) and gives each rank one slice of
    the first dimension: rank ``r`` gets ``rows // size`` rows, plus one if
    ``r < rows % size``.

    Example::

        part = hvd.reducescatter(torch.ones(4, 2), op=hvd.Sum)  # 2 rows each on 2 ranks
    """
    _check_process_set(process_set)
    _core.require_initialized()
    reduce_op = resolve_op(op, None)
    compressed, ctx = compression.compress(tensor)
    result = _ReducescatterFn.apply(
        compressed,
        _core.op_name("reducescatter", name),
        reduce_op,
        prescale_factor,
        postscale_factor,
    )
    return compression.decompress(result, ctx)


def barrier(process_set: Any = None) -> None:
    """Blocks until every rank has called ``barrier()``.

    Example::

        hvd.barrier()
    """
    _check_process_set(process_set)
    _core.require_initialized()
    _native.barrier()


def _check_process_set(process_set: Any) -> None:
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise InvalidArgumentError(
            "only the global process set exists in this kolo version; omit process_set="
        )
