"""The tensors the engine reads and writes for kolo.torch's ops: dtype names, where a tensor's
buffer lives while an op runs (the tensor itself, a CPU copy, a pinned host copy of a CUDA
tensor, or the CUDA tensor on the NCCL path: see ``_staging``), and the engine's results back
into tensors."""

from __future__ import annotations

from typing import Any

import torch

from kolo.exceptions import InvalidArgumentError
from kolo.torch._staging import on_nccl, to_pinned_host

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


def _staged(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s values (`tensor` itself when it already is one;
    a pinned copy of a CUDA tensor: the host-staged path)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_cuda:
        return to_pinned_host(tensor)
    if tensor.is_contiguous() and tensor.device.type == "cpu":
        return tensor.detach()
    return tensor.detach().cpu().contiguous()


def _device_or_staged(tensor: torch.Tensor, nccl: bool = True) -> torch.Tensor:
    """``tensor`` itself when the engine runs it through NCCL (see ``on_nccl``; never when
    ``nccl`` is False, e.g. for Adasum, which runs on the host), else :func:`_staged`."""
    if nccl and isinstance(tensor, torch.Tensor) and tensor.is_cuda and on_nccl(tensor):
        return tensor.detach()
    return _staged(tensor)


def _device_or_owned(tensor: torch.Tensor, nccl: bool = True) -> torch.Tensor:
    """A copy on ``tensor``'s device when the engine runs it through NCCL (and ``nccl``),
    else :func:`_owned_copy`."""
    if nccl and isinstance(tensor, torch.Tensor) and tensor.is_cuda and on_nccl(tensor):
        return tensor.detach().clone()
    return _owned_copy(tensor)


def _owned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s values that shares no memory with it."""
    staged = _staged(tensor)
    return staged.clone() if staged.data_ptr() == tensor.data_ptr() else staged


def _plain_cpu(tensor: Any) -> bool:
    """True for a contiguous CPU tensor: the engine reads and writes it where it is."""
    return isinstance(tensor, torch.Tensor) and tensor.is_cpu and tensor.is_contiguous()


def _require_dim(tensor: torch.Tensor, what: str) -> None:
    if tensor.dim() == 0:
        raise InvalidArgumentError(
            f"{what} works on the first dimension, but got a 0-dim tensor; use "
            "tensor.reshape(1) (or unsqueeze(0)) first"
        )


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # Asynchronous from pinned memory; from pageable memory the copy has read its source when
    # it returns, so the engine may reuse that buffer.
    if like.device.type == "cpu":
        return result
    return result.to(like.device, non_blocking=True)


def _write_back(target: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
    if staged.data_ptr() != target.data_ptr():
        with torch.no_grad():
            target.copy_(staged, non_blocking=target.device.type == "cuda")
    return target


def _from_bytes(data: Any, rows: int, like: torch.Tensor) -> torch.Tensor:
    """The engine's output (a DLPack capsule of its bytes, taken over without a copy) as a
    ``(rows, *like.shape[1:])`` tensor of ``like``'s dtype."""
    shape = (rows, *like.shape[1:])
    flat = torch.from_dlpack(data)
    if flat.numel() == 0:
        return torch.empty(shape, dtype=like.dtype)
    return flat.view(like.dtype).reshape(shape)
