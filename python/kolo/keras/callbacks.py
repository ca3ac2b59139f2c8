"""Horovod's Keras callbacks for Keras 3: ``import kolo.keras as hvd; hvd.callbacks.X``.

Callbacks run in Python between steps (outside any compiled graph), so they call kolo's
collectives eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Optional

import keras
import numpy as np

from kolo import _core
from kolo.exceptions import ConfigError, InvalidValueError
from kolo.keras import _arrays, _bridge
from kolo.keras.functions import broadcast_variables
from kolo.process_sets import global_process_set, resolve

__all__ = [
    "BestModelCheckpoint",
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]

log = logging.getLogger("kolo.keras")


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from ``root_rank``'s model and optimizer state.

    At the start of training it builds the optimizer on the model's trainable variables where
    Keras has not yet (what its first step would do, so every rank holds the same variables, a
    rank that restored a checkpoint included) and broadcasts ``model.variables`` and the
    optimizer's variables. Use it together with ``DistributedOptimizer``. The model
    variables in ``local_variables`` (a ``keras.Variable`` or a list of them, e.g. the weights
    of a ``PartialDistributedOptimizer``'s local layers) or registered with
    :meth:`register_local_var` keep each rank's own values, as in Horovod.

    Example::

        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    """

    def __init__(
        self,
        root_rank: int = 0,
        device: str = "",
        local_variables: Any = None,
        process_set: Any = None,
    ) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device  # accepted for Horovod compatibility (kolo stages through host)
        self.process_set = process_set or global_process_set
        self.broadcast_done = False
        self._local_vars: list[Any] = []
        if local_variables is None:
            local_variables = []
        elif isinstance(local_variables, keras.Variable):
            local_variables = [local_variables]
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Leaves ``var`` out of the broadcast: every rank keeps its own value.

        Example::

            callback.register_local_var(model.layers[-1].kernel)
        """
        if not isinstance(var, keras.Variable):
            raise InvalidValueError(
                f"local_variables must be keras.Variable objects, got {type(var).__name__}"
            )
        if not any(v is var for v in self._local_vars):
            self._local_vars.append(var)

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        """Broadcasts the model's and the optimizer's variables from ``root_rank`` (once)."""
        if self.broadcast_done:
            return
        local = {id(v) for v in self._local_vars}
        shared = [v for v in self.model.variables if id(v) not in local]
        broadcast_variables(shared, self.root_rank, self.process_set)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            broadcast_variables(optimizer.variables, self.root_rank, self.process_set)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch's metrics (loss, accuracy, ``val_*``) by their mean over all ranks,
    so every rank logs, checkpoints and early-stops on the same numbers. List it before
    callbacks that read the metrics.

    Example::

        callbacks = [hvd.callbacks.MetricAverageCallback(), keras.callbacks.EarlyStopping()]
    """

    def __init__(self, device: str = "", process_set: Any = None) -> None:
        super().__init__()
        self.device = device  # accepted for Horovod compatibility
        self.process_set = process_set or global_process_set

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Replaces each scalar metric in ``logs`` by its average over the ranks."""
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(_bridge.to_numpy(v)) == 0)
        values = np.array([float(_bridge.to_numpy(logs[k])) for k in keys], dtype=np.float64)
        every = _arrays.allgather_object(
            keys, _core.op_name("metric_average.keys", None), resolve(self.process_set)
        )
        if any(other != keys for other in every):
            raise InvalidValueError(
                f"MetricAverageCallback: ranks logged different metrics ({every}); compile every "
                "rank's model alike"
            )
        (mean,) = _arrays.allreduce(
            [values],
            [f"metric_average.{epoch}"],
            _core.Average,
            1.0,
            1.0,
            resolve(self.process_set),
        )
        for key, value in zip(keys, mean.tolist()):
            logs[key] = value


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` up to
    ``end_epoch``: at each epoch start (``staircase=True``) or at each batch with a fractional
    epoch (``staircase=False``; needs ``steps_per_epoch`` or ``model.fit``'s own count).

    ``momentum_correction`` scales SGD's momentum buffers by ``new_lr / old_lr`` when the rate
    changes (Goyal et al.), what Horovod does by adjusting the momentum for one step.

    Example::

        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=0.1 * hvd.size(), multiplier=lambda epoch: 0.1 ** (epoch // 30)
        )
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: Any,
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
    ) -> None:
        super().__init__()
        if initial_lr is None or float(initial_lr) <= 0:
            raise InvalidValueError(
                f"initial_lr must be a positive learning rate, got {initial_lr!r} (Horovod made it "
                "a required argument: pass the optimizer's starting rate)"
            )
        self.initial_lr = float(initial_lr)
        self.start_epoch = int(start_epoch)
        self.end_epoch = end_epoch
        self.staircase = bool(staircase)
        self.momentum_correction = bool(momentum_correction)
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: Optional[int] = None
        if callable(multiplier):
            self.multiplier: Callable[[float], float] = multiplier
        else:
            constant = float(multiplier)
            self.multiplier = lambda epoch: constant

    def _in_range(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set_lr(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise ConfigError(
                "the optimizer's learning_rate is a LearningRateSchedule; learning-rate callbacks "
                "need a plain float rate"
            )
        old = float(_bridge.to_numpy(optimizer.learning_rate))
        new = self.initial_lr * float(self.multiplier(epoch))
        optimizer.learning_rate = new
        momentums = getattr(optimizer, "momentums", None)
        if self.momentum_correction and momentums and old > 0 and new != old:
            ratio = new / old
            for m in momentums:
                if m is not None:
                    m.assign(m * ratio)

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        """Learns the steps per epoch from Keras when not given (needed without staircase)."""
        if self.steps_per_epoch is None and not self.staircase:
            self.steps_per_epoch = self.params.get("steps") if self.params else None
        if not self.staircase and not self.steps_per_epoch:
            raise ConfigError(
                "LearningRateScheduleCallback(staircase=False) needs steps_per_epoch (model.fit "
                "did not know the number of steps per epoch)"
            )

    def on_epoch_begin(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Sets the epoch's learning rate (staircase schedules)."""
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._set_lr(epoch)

    def on_train_batch_begin(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Sets the learning rate of this point in the epoch (smooth schedules)."""
        if self.staircase or self.current_epoch is None:
            return
        epoch = self.current_epoch + float(batch) / float(self.steps_per_epoch or 1)
        if self._in_range(epoch):
            self._set_lr(epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Records the learning rate in ``logs["lr"]``."""
        if logs is not None:
            logs["lr"] = float(_bridge.to_numpy(self.model.optimizer.learning_rate))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs`` (batch by batch), as in Goyal et al.'s large-batch recipe.

    Example::

        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1 * hvd.size(), momentum=0.9))
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * hvd.size(), warmup_epochs=3)
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        verbose: int = 0,
    ) -> None:
        def multiplier(epoch: float) -> float:
            size = _core.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        """Ends the warmup at exactly ``initial_lr`` after its last epoch."""
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1:
            # The last batches of warmup stop short of initial_lr: finish the ramp.
            self._set_lr(float(self.warmup_epochs))
            if self.verbose and _core.rank() == 0:
                log.info(
                    "epoch %d: finished gradual learning rate warmup to %g",
                    epoch + 1,
                    self.initial_lr,
                )


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the best model seen so far (by ``monitor``) to ``filepath``, on rank 0 only.

    ``filepath`` may be left out when a ``KerasEstimator`` sets it (its run's checkpoint).

    Example::

        hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath="best.keras")
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        mode: str = "auto",
        save_freq: Any = "epoch",
        filepath: Optional[str] = None,
    ) -> None:
        super().__init__(
            filepath=filepath or "unset.keras",
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            save_weights_only=False,
            mode=mode,
            save_freq=save_freq,
        )
        self.filepath = filepath

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        """Checks that the callback has a file to write (:class:`~kolo.exceptions.ConfigError`)."""
        if not self.filepath:
            raise ConfigError(
                "BestModelCheckpoint has no filepath: pass filepath='best.keras' (a KerasEstimator "
                "sets it to its run's checkpoint)"
            )
        if not str(self.filepath).endswith((".keras", ".h5")):
            raise ConfigError(
                f"BestModelCheckpoint filepath must end in .keras, got {self.filepath!r}"
            )
        super().on_train_begin(logs)

    def _save_model(self, *args: Any, **kwargs: Any) -> None:
        if not _core.is_initialized() or _core.rank() == 0:
            super()._save_model(*args, **kwargs)
