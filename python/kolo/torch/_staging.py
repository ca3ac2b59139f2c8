"""CUDA tensors in ``kolo.torch.ops``: NCCL through the engine where it can, else the
host-staged path (a pinned host copy for the engine's CPU collectives).

Pinned (page-locked) memory copies at full PCIe/NVLink-C2C speed and lets the result go back
to the device asynchronously (torch's caching host allocator keeps the buffer until that copy
ran), so ``hvd.allreduce`` & co. on CUDA tensors work without NCCL.

Example::

    host = to_pinned_host(torch.ones(3, device="cuda"))
    assert host.is_pinned() and host.device.type == "cpu"
"""

from __future__ import annotations

import functools
import os

import torch


def to_pinned_host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous pinned CPU copy of CUDA ``tensor``, complete when this returns (the copy
    is ordered after the work queued on the tensor's current stream).

    Example::

        staged = to_pinned_host(grad)
    """
    src = tensor.detach()
    host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    host.copy_(src, non_blocking=True)
    torch.cuda.current_stream(src.device).synchronize()
    return host


#: Dtypes NCCL carries (int16 has no NCCL type and stays on the host-staged path).
_NCCL_DTYPES = frozenset(
    {
        torch.uint8,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.bool,
    }
)


@functools.cache
def _nccl_available() -> bool:
    if os.environ.get("KOLO_CUDA_STAGED", "").lower() in ("1", "true", "yes"):
        return False
    from kolo import _native

    return bool(_native.cuda_probe()["nccl"])


def on_nccl(tensor: torch.Tensor) -> bool:
    """Whether the engine runs ``tensor``'s allreduce/broadcast through NCCL on its device:
    a contiguous CUDA tensor of a dtype NCCL carries, NCCL found at run time, and
    ``KOLO_CUDA_STAGED`` not set (which forces the host-staged path).

    Example::

        on_nccl(torch.ones(3))  # False: a CPU tensor
    """
    return (
        tensor.device.type == "cuda"
        and tensor.dtype in _NCCL_DTYPES
        and tensor.is_contiguous()
        and _nccl_available()
    )


def ready_event(tensor: torch.Tensor) -> torch.cuda.Event:
    """An event recorded now on the current stream of ``tensor``'s device: the engine's NCCL
    op waits for it, so the work torch queued before the submission comes first.

    Example::

        event = ready_event(grad)
        handle = _native.submit(..., device=grad.device.index, ready_event=event.cuda_event)
    """
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event
