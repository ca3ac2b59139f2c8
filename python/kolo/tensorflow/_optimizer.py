"""Horovod's ``horovod.tensorflow.DistributedOptimizer`` for Keras-3-era optimizers.

As Horovod hands Keras optimizers to ``horovod.tensorflow.keras.DistributedOptimizer``, kolo
hands them to ``kolo.keras.DistributedOptimizer`` (gradients averaged over the ranks inside
``apply_gradients``, eagerly or in ``tf.function``). TensorFlow 1 optimizers
(``tf.compat.v1.train.Optimizer``) are refused with a typed error.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from kolo._core import Average
from kolo.exceptions import InvalidArgumentError, NotSupportedError
from kolo.keras import compression as keras_compression
from kolo.keras import optimizer as keras_optimizer
from kolo.process_sets import global_process_set
from kolo.tensorflow.compression import Compression

#: kolo.tensorflow's compressors (on TensorFlow tensors) → kolo.keras's (on the numpy arrays
#: kolo.keras reduces): the same casts.
_KERAS_COMPRESSION = {
    Compression.none: keras_compression.Compression.none,
    Compression.fp16: keras_compression.Compression.fp16,
    Compression.bf16: keras_compression.Compression.bf16,
}


def DistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Wraps a Keras optimizer (``tf.keras.optimizers.*``, Keras 3) so that every
    ``apply_gradients`` applies the gradients averaged over the ranks (``op``), eagerly or
    inside ``tf.function``; see ``kolo.keras.DistributedOptimizer`` for the options.
    ``use_locking`` (TensorFlow 1) and ``scale_local_gradients`` (no local variables can be
    registered with it) are accepted for Horovod compatibility.

    Example::

        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    """
    legacy = getattr(getattr(tf.compat, "v1", None), "train", None)
    if legacy is not None and isinstance(optimizer, legacy.Optimizer):
        raise NotSupportedError(
            "TensorFlow 1 optimizers (tf.compat.v1.train.Optimizer) are not supported by kolo; "
            "use a Keras optimizer (tf.keras.optimizers) or hvd.DistributedGradientTape"
        )
    if compression not in _KERAS_COMPRESSION:
        raise InvalidArgumentError(
            f"DistributedOptimizer takes hvd.Compression.none, .fp16 or .bf16, got "
            f"{compression!r} (a Keras optimizer reduces its gradients through kolo.keras)"
        )
    return keras_optimizer.DistributedOptimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=_KERAS_COMPRESSION[compression],
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups,
        groups=groups,
        process_set=process_set,
    )
