"""Horovod's ``horovod.tensorflow.elastic`` for TensorFlow 2 (eager): ``TensorFlowKerasState``,
``TensorFlowState`` and ``run`` (see docs/elastic.md).

Example::

    import kolo.tensorflow as hvd

    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer=opt, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, batches):
            training_step(*next(data))  # a tf.function with hvd.DistributedGradientTape
            if state.batch % 10 == 0:
                state.commit()

    train(state)
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from kolo import _core
from kolo.elastic import ObjectState
from kolo.exceptions import NotSupportedError
from kolo.keras.elastic import KerasState, run
from kolo.tensorflow.functions import broadcast_object, broadcast_variables

__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]


def _eager_only(what: str) -> None:
    if not tf.executing_eagerly():
        raise NotSupportedError(
            f"{what} supports TensorFlow 2 eager execution only (TensorFlow 1 sessions are not "
            "supported by kolo)"
        )


class TensorFlowKerasState(KerasState):
    """The state of a Keras model and its optimizer (Horovod's ``TensorFlowKerasState``), plus
    plain attributes: commits copy the model's and the optimizer's variables to host memory,
    ``restore()`` assigns them back, ``sync()`` broadcasts rank 0's and commits them.
    ``backend`` (TensorFlow 1's Keras session) must be None.

    Example::

        state = hvd.elastic.TensorFlowKerasState(model, optimizer=opt, batch=0, epoch=0)
    """

    def __init__(
        self, model: Any, optimizer: Optional[Any] = None, backend: Any = None, **kwargs: Any
    ) -> None:
        _eager_only("TensorFlowKerasState")
        if backend is not None:
            raise NotSupportedError(
                "TensorFlowKerasState(backend=...) is for TensorFlow 1 sessions, which kolo does "
                "not support; leave it None"
            )
        super().__init__(model, optimizer, **kwargs)


class TensorFlowState(ObjectState):
    """The state of a list of ``tf.Variable`` (Horovod's ``TensorFlowState``), plus plain
    attributes: commits copy the variables to host memory, ``restore()`` assigns them back,
    ``sync()`` broadcasts rank 0's and commits them. ``session`` (TensorFlow 1) must be None.

    Example::

        state = hvd.elastic.TensorFlowState(model.variables + opt.variables, step=0)
    """

    def __init__(
        self, variables: Optional[list[Any]] = None, session: Any = None, **kwargs: Any
    ) -> None:
        _eager_only("TensorFlowState")
        if session is not None or variables is None:
            raise NotSupportedError(
                "TensorFlowState needs its variables (TensorFlow 1's global variables and "
                "sessions are not supported by kolo): pass variables=[...]"
            )
        self.variables = list(variables)
        self.session = None
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=_core.rank, **kwargs)

    def _save_model(self) -> None:
        self._values = [np.array(tf.convert_to_tensor(v), copy=True) for v in self.variables]

    def save(self) -> None:
        """Copies the variables to host memory, and the attributes."""
        self._save_model()
        super().save()

    def restore(self) -> None:
        """Assigns the committed values and attributes back."""
        for var, value in zip(self.variables, self._values, strict=True):
            var.assign(value)
        super().restore()

    def sync(self) -> None:
        """Broadcasts rank 0's variables and attributes, and commits them."""
        broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().sync()
