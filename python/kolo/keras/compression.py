"""Gradient compression for ``kolo.keras``, with Horovod's names (``hvd.Compression.fp16``).

Compressors work on the numpy arrays that travel to kolo's engine, so they are the same for
every Keras backend.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Compresses an array before a collective and restores it afterwards."""

    @staticmethod
    def compress(array: np.ndarray) -> tuple[np.ndarray, Any]:
        """Returns the array to send and the context :meth:`decompress` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(array: np.ndarray, ctx: Any) -> np.ndarray:
        """Restores an array returned by :meth:`compress` after the collective."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends arrays as they are.

    Example::

        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.none)
    """

    @staticmethod
    def compress(array: np.ndarray) -> tuple[np.ndarray, Any]:
        """``(array, None)``: nothing to undo."""
        return array, None

    @staticmethod
    def decompress(array: np.ndarray, ctx: Any) -> np.ndarray:
        """``array`` as it came."""
        return array


class _CastCompressor(Compressor):
    """Sends floating-point arrays as ``wire_dtype`` and casts the result back."""

    wire_dtype: Any

    @classmethod
    def compress(cls, array: np.ndarray) -> tuple[np.ndarray, Any]:  # type: ignore[override]
        if np.issubdtype(array.dtype, np.floating) or array.dtype == ml_dtypes.bfloat16:
            return array.astype(cls.wire_dtype), array.dtype
        return array, array.dtype

    @staticmethod
    def decompress(array: np.ndarray, ctx: Any) -> np.ndarray:
        return array if ctx is None or array.dtype == ctx else array.astype(ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point arrays as float16 and casts the result back.

    Example::

        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)
    """

    wire_dtype = np.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point arrays as bfloat16 (float32's range, fewer mantissa bits).

    Example::

        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.bf16)
    """

    wire_dtype = ml_dtypes.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16`` and
    ``Compression.bf16``.

    Example::

        hvd.allreduce(grad, compression=hvd.Compression.fp16)
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
