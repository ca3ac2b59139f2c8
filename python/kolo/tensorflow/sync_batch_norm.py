"""Horovod's ``horovod.tensorflow.SyncBatchNormalization`` for Keras 3 (``tf.keras``)."""

from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf

from kolo.exceptions import InvalidArgumentError
from kolo.tensorflow import mpi_ops

__all__ = ["SyncBatchNormalization"]


@keras.saving.register_keras_serializable(package="kolo")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization whose training statistics are those of the whole batch over every
    rank, as Horovod's: each rank's mean and mean of squares are summed over the ranks in one
    allreduce (differentiable, so the gradient is that of the global batch) and divided by the
    size (every rank must use the same batch size). Inference and the moving statistics use
    the synchronized values. ``fused`` must stay False, as in Horovod.

    Example::

        model = tf.keras.Sequential([
            tf.keras.layers.Dense(32),
            hvd.SyncBatchNormalization(),
            tf.keras.layers.ReLU(),
        ])
    """

    def __init__(self, fused: Optional[bool] = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise InvalidArgumentError("SyncBatchNormalization does not support fused=True")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        """The mean and variance of the global batch (Var[X] = E[X^2] - E[X]^2)."""
        worker_mean, worker_variance = super()._moments(inputs, mask)
        world = mpi_ops.size()
        if world <= 1:
            return worker_mean, worker_variance
        worker_mean_of_square = worker_variance + tf.math.square(worker_mean)
        stack = tf.stack([worker_mean, worker_mean_of_square])
        group = mpi_ops._allreduce(stack, op=mpi_ops.Sum) / tf.cast(world, stack.dtype)
        group_mean, group_mean_of_square = tf.unstack(group)
        return group_mean, group_mean_of_square - tf.math.square(group_mean)
