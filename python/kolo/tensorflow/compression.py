"""Gradient compression for ``kolo.tensorflow``, with Horovod's names (``hvd.Compression.fp16``).

As in Horovod, compressors work on TensorFlow tensors: ``compress`` runs before the collective
(eagerly or in the graph), ``decompress`` after it, so a custom ``Compressor`` may use any
TensorFlow op.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface for compressing and decompressing a given tensor."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Compresses a tensor and returns it with the context needed to decompress it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Decompresses the tensor with the given context."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Default no-op compression.

    Example::

        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.none)
    """

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """Returns the tensor unmodified."""
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Returns the tensor unmodified."""
        return tensor


class _CastCompressor(Compressor):
    """Sends floating-point tensors as ``wire_dtype`` and casts the result back."""

    wire_dtype: Any

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:  # type: ignore[override]
        """Casts a floating-point tensor to the wire dtype."""
        if tensor.dtype.is_floating:
            return tf.cast(tensor, dtype=cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Casts back to the dtype the tensor had before :meth:`compress`."""
        if ctx is not None and ctx.is_floating and tensor.dtype != ctx:
            return tf.cast(tensor, dtype=ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Compresses all floating point gradients to 16-bit.

    Example::

        tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16)
    """

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Compresses all floating point gradients to bfloat16 (float32's range, fewer mantissa
    bits); a kolo addition.

    Example::

        hvd.allreduce(grad, compression=hvd.Compression.bf16)
    """

    wire_dtype = tf.bfloat16


class Compression:
    """Optional gradient compression algorithm used during allreduce: ``Compression.none``
    (the default), ``Compression.fp16`` and ``Compression.bf16``.

    Example::

        hvd.allreduce(grad, compression=hvd.Compression.fp16)
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
