"""Gradient compression for allreduce, with Horovod's names (``hvd.Compression.fp16``)."""

from __future__ import annotations

import abc
from typing import Any

import torch

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor(abc.ABC):
    """Compresses a tensor before a collective and restores it afterwards."""

    @staticmethod
    @abc.abstractmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Returns the tensor to send and the context :meth:`decompress` needs."""

    @staticmethod
    @abc.abstractmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Restores a tensor returned by :meth:`compress` after the collective."""


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(tensor, None)``: nothing to undo."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``tensor`` as it came."""
        return tensor


class _CastCompressor(Compressor):
    """Sends floating-point tensors as ``wire_dtype`` and casts the result back."""

    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:  # type: ignore[override]
        if tensor.dtype.is_floating_point:
            return tensor.type(cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None or tensor.dtype == ctx else tensor.type(ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 and casts the result back.

    Example::

        hvd.allreduce(grad, compression=hvd.Compression.fp16)
    """

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 and casts the result back.

    bfloat16 keeps float32's exponent range (no overflow where float16 would) with fewer
    mantissa bits.

    Example::

        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.bf16)
    """

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.bf16``.

    Example::

        hvd.allreduce(grad, compression=hvd.Compression.bf16)
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
