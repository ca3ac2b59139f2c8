"""Horovod's elastic Keras API (``horovod.tensorflow.keras.elastic``) for Keras 3:
``import kolo.keras as hvd`` then ``hvd.elastic.KerasState``, the three state callbacks and
``hvd.elastic.run`` (see docs/elastic.md).

Example::

    import kolo.keras as hvd

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        state.model.fit(
            x, y, epochs=5 - state.epoch, steps_per_epoch=10,
            callbacks=[
                hvd.elastic.CommitStateCallback(state),
                hvd.elastic.UpdateBatchStateCallback(state),
                hvd.elastic.UpdateEpochStateCallback(state),
            ],
        )

    train(state)
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any, Callable, Optional, TypeVar

import keras
import numpy as np

from kolo import _core, exceptions
from kolo.elastic import ObjectState, reset, run_fn
from kolo.keras import _bridge
from kolo.keras.functions import broadcast_variables
from kolo.keras.ops import broadcast_object

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


F = TypeVar("F", bound=Callable[..., Any])

#: How a kolo error raised inside a compiled TensorFlow step appears in the op error's message.
_KOLO_ERROR_LINE = re.compile(r"kolo\.exceptions\.(\w+): ([^\n]*)")


def collective_failure(err: BaseException) -> Optional[exceptions.InternalError]:
    """The kolo collective failure that a TensorFlow op error carries, or None.

    A collective that fails inside ``model.fit``'s compiled step (TensorFlow backend) reaches
    Python as ``tf.errors.UnknownError`` whose message holds the kolo error; Horovod's
    ``run`` turns such errors (naming its ops) into ``HorovodInternalError`` in the same way.
    """
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(err, tf.errors.OpError):
        return None
    found = _KOLO_ERROR_LINE.findall(str(err))
    if not found:
        return None
    name, message = found[-1]
    cls = getattr(exceptions, name, None)
    if not (isinstance(cls, type) and issubclass(cls, exceptions.InternalError)):
        return None
    return cls(message)


def run(func: F) -> F:
    """Decorator running an elastic Keras training function (Horovod's ``hvd.elastic.run`` of
    ``horovod.tensorflow.keras``): :func:`kolo.elastic.run`, plus a collective failing inside
    a compiled TensorFlow step counts as the failed collective it is (restore and reset).

    Example::

        @hvd.elastic.run
        def train(state):
            state.model.fit(x, y, epochs=epochs - state.epoch, callbacks=callbacks)

        train(hvd.elastic.KerasState(model, batch=0, epoch=0))
    """

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except Exception as err:
            failure = collective_failure(err)
            if failure is None:
                raise
            raise failure from err

    return run_fn(wrapper, reset)  # type: ignore[return-value]


def _host_values(variables: list[Any]) -> list[np.ndarray]:
    return [np.array(_bridge.to_numpy(v), copy=True) for v in variables]


class KerasState(ObjectState):
    """The state of a Keras model and its optimizer (Horovod's ``KerasState``), plus plain
    attributes. Commits copy the model's and the optimizer's variables to host memory (numpy
    arrays); ``sync()`` broadcasts rank 0's and commits them.

    The model must be built; the optimizer (``optimizer``, else the model's compiled one) is
    built on the model's trainable variables if it is not yet, so its slots exist to commit.

    Args:
        model: a built Keras model.
        optimizer: its optimizer, when it is not compiled into the model.
        kwargs: further attributes to track (e.g. ``batch=0, epoch=0``).

    Example::

        state = hvd.elastic.KerasState(model, batch=0, epoch=0)
        state.commit()
    """

    def __init__(self, model: keras.Model, optimizer: Optional[Any] = None, **kwargs: Any) -> None:
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=_core.rank, **kwargs)

    def _optimizer_variables(self) -> list[Any]:
        return list(self.optimizer.variables) if self.optimizer is not None else []

    def _save_model(self) -> None:
        self._saved_model_state = _host_values(self.model.variables)
        self._saved_optimizer_state = _host_values(self._optimizer_variables())

    def _load_model(self) -> None:
        for var, value in zip(self.model.variables, self._saved_model_state, strict=True):
            var.assign(value)
        for var, value in zip(
            self._optimizer_variables(), self._saved_optimizer_state, strict=True
        ):
            var.assign(value)

    def save(self) -> None:
        """Copies the model's and the optimizer's variables to host memory, and the attributes."""
        self._save_model()
        super().save()

    def restore(self) -> None:
        """Assigns the committed variables and attributes back."""
        self._load_model()
        super().restore()

    def reset(self) -> None:
        """After a reset: drops the model's compiled train/test/predict functions, so the next
        ``fit`` traces its step for the new job size (a step traced on one rank leaves the
        gradient allreduce out; Horovod's example calls ``fit`` once more in a reset callback
        for the same reason)."""
        self.model.train_function = None
        self.model.test_function = None
        self.model.predict_function = None

    def sync(self) -> None:
        """Broadcasts rank 0's variables and attributes, and commits them."""
        broadcast_variables(self.model.variables, root_rank=0)
        broadcast_variables(self._optimizer_variables(), root_rank=0)
        self._save_model()
        super().sync()


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end of every epoch.

    Args:
        state: the state to commit.
        batches_per_commit: batches between commits (default 1).

    Example::

        model.fit(x, y, callbacks=[hvd.elastic.CommitStateCallback(state, batches_per_commit=10)])
    """

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        """Restarts the count (every rank counts from the same point after a reset)."""
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Commits when ``batches_per_commit`` batches have passed."""
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Commits."""
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the current batch number (0 again at the end of an epoch).

    Horovod's callback also shortens the first epoch after a reset by the batches already done
    (through ``params["steps"]``, which Keras 2 read every step). Keras 3 fixes an epoch's
    length when ``fit`` starts and offers a callback no way to end one early, so here the
    first epoch after a reset runs its full ``steps_per_epoch``; to skip the batches already
    done, start that ``fit`` with a dataset that leaves them out.

    Args:
        state: the state whose ``batch`` to update.

    Example::

        callback = hvd.elastic.UpdateBatchStateCallback(state)
        model.fit(x, y, steps_per_epoch=10, callbacks=[callback])
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Records the batch number."""
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Sets ``state.batch`` back to 0."""
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the number of epochs completed across resets (Keras counts
    from 0 in every ``fit``).

    Args:
        state: the state whose ``epoch`` to update.

    Example::

        callback = hvd.elastic.UpdateEpochStateCallback(state)
        model.fit(x, y, epochs=5 - state.epoch, callbacks=[callback])
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        """Remembers the epoch this ``fit`` starts from."""
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Sets ``state.epoch`` to the epochs completed (one past the epoch just ended)."""
        self.state.epoch = self.initial_epoch + epoch + 1
