"""The Keras estimator's per-rank training loop (Horovod's ``horovod.spark.keras.remote``),
launcher-neutral (:class:`kolo.spark.keras.KerasEstimator` runs it under
:func:`kolo.spark.run`), and Keras models as bytes (:func:`model_to_bytes`,
:func:`model_from_bytes`) for the trip to the ranks, the checkpoints and the trained model.

:class:`KerasTrainer` is built on the driver (the model as ``.keras`` bytes, the other user
objects cloudpickled) and called once in every rank by the launcher. Each rank
sets ``backend_env``, joins the job (``kolo.keras.init()``), rebuilds the model, compiles it
with a ``kolo.keras.DistributedOptimizer`` (learning rate multiplied by the number of ranks, as
Horovod does) and runs Keras's own ``model.fit`` on its equal share of the prepared Parquet
data (:class:`kolo.data.ParquetLoader` with ``to="numpy"``), with the broadcast and
metric-average callbacks. Rank 0 checkpoints after every epoch into the run's checkpoint file
(:func:`~kolo.estimator.spec.checkpoint_file`; a run restarted with the same ``run_id`` resumes
from it), reports progress to the driver and returns the trained model and the history.

A model travels as a ``.keras`` archive (architecture, weights and optimizer state; the same
on every Keras backend), loaded with the estimator's ``custom_objects``. The other user objects
travel cloudpickled and are only unpickled after the rank has set its environment
(``backend_env``, e.g. ``KERAS_BACKEND``), because unpickling them imports Keras. Importing
this module imports neither Keras nor PySpark.

Example (one rank, in-process)::

    trainer = KerasTrainer(spec)   # spec: a KerasSpec, built by KerasEstimator
    result = trainer()             # {"model": <.keras bytes>, "history": {...}, ...}
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import cloudpickle

from kolo.estimator.progress import (
    ProgressReporter,
    rank_result,
    rank_timings,
    resume_position,
    send_progress,
)
from kolo.estimator.spec import TrainingSpec, checkpoint_bytes, checkpoint_file
from kolo.exceptions import DataError

__all__ = ["KerasSpec", "KerasTrainer", "load_checkpoint", "model_from_bytes", "model_to_bytes"]

log = logging.getLogger(__name__)


def model_to_bytes(model: Any) -> bytes:
    """``model`` as the bytes of a ``.keras`` archive (with its optimizer's state when
    compiled).

    Example::

        data = model_to_bytes(model)
    """
    with tempfile.TemporaryDirectory(prefix="kolo-keras-") as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(
    data: bytes, custom_objects: Optional[Dict[str, Any]] = None, compile: bool = False
) -> Any:
    """The model saved by :func:`model_to_bytes` (``compile=True`` also restores its optimizer,
    loss and metrics).

    Example::

        model = model_from_bytes(data, custom_objects=None)
    """
    import kolo.keras  # noqa: F401 - loads triton before TensorFlow (kolo.keras._preload)

    # isort: split
    import keras

    with tempfile.TemporaryDirectory(prefix="kolo-keras-") as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, custom_objects=custom_objects, compile=compile)


@dataclass
class KerasSpec(TrainingSpec):
    """A :class:`~kolo.estimator.spec.TrainingSpec` plus the Keras model and objects as bytes
    (see the module docstring).

    Example::

        spec = KerasSpec(**spec_fields(param, store, run_id, meta), model_bytes=...,
                         objects_bytes=..., backend_env={})
    """

    model_bytes: bytes
    #: cloudpickled dict: optimizer (``keras.optimizers.serialize``), loss, loss_weights, metrics,
    #: callbacks, custom_objects, checkpoint_callback, transformation_fn, compression.
    objects_bytes: bytes
    backend_env: Dict[str, str]


def load_checkpoint(store: Any, run_id: str) -> Optional[Dict[str, Any]]:
    """The checkpoint of ``run_id`` in ``store``: ``model`` (``.keras`` bytes, optimizer state
    included), ``epoch`` (the last finished epoch, 0-based), ``history``, ``loader`` and
    ``best`` (the checkpoint callback's file, if any); ``None`` when there is none.

    Example::

        ckpt = load_checkpoint(store, "run_1")
        print(ckpt["epoch"], ckpt["history"]["loss"])
    """
    data = checkpoint_bytes(store, run_id)
    return None if data is None else cloudpickle.loads(data)


def _float_to_floatx(array: Any, floatx: str) -> Any:
    import numpy as np

    if np.issubdtype(array.dtype, np.floating) and array.dtype != np.dtype(floatx):
        return array.astype(floatx)
    return array


def _dataset(loader: Any, steps: int, to_batch: Callable[[Dict[str, Any]], Any]) -> Any:
    """A ``keras.utils.PyDataset`` over a rank's :class:`~kolo.data.ParquetLoader`: ``steps``
    batches per Keras epoch, read sequentially and without end (a rank goes on into the
    loader's next epoch when ``steps`` ends mid-epoch, as Horovod's infinite reader).

    Keras (TensorFlow backend) reads the first two items to learn the batch structure before
    the epoch starts; items are kept by index within an epoch so those are not lost. (Defined
    inside the rank: the class subclasses ``keras.utils.PyDataset``.)
    """
    import keras

    class LoaderDataset(keras.utils.PyDataset):
        def __init__(self) -> None:
            super().__init__(workers=1, use_multiprocessing=False)
            self.stream = self._endless()
            self.cache: Dict[int, Any] = {}
            self.produced = 0

        def _endless(self) -> Any:
            while True:
                yielded = False
                for batch in loader:
                    yielded = True
                    yield batch
                if not yielded:
                    return

        @property
        def num_batches(self) -> int:
            return steps

        def __len__(self) -> int:
            return steps

        def __getitem__(self, index: int) -> Any:
            while index >= self.produced:
                self.cache[self.produced] = to_batch(next(self.stream))
                self.produced += 1
                # Keep the first two (Keras's structure peek) and a short window.
                for old in [i for i in self.cache if 2 <= i < self.produced - 2]:
                    del self.cache[old]
            return self.cache[index]

        def on_epoch_end(self) -> None:
            self.cache.clear()
            self.produced = 0

    return LoaderDataset()


class KerasTrainer:
    """The function every rank runs (picklable; see the module docstring).

    ``send(obj)`` delivers rank 0's progress messages to the driver (default:
    :func:`~kolo.estimator.progress.send_progress`).

    Example::

        trainer = KerasTrainer(spec, send=print)
    """

    def __init__(self, spec: KerasSpec, send: Optional[Callable[[Any], None]] = None):
        self.spec = spec
        self.send = send or send_progress

    # -- set-up -----------------------------------------------------------------------------

    def _build(self, hvd: Any, keras: Any) -> None:
        spec = self.spec
        objects = cloudpickle.loads(spec.objects_bytes)
        self.objects = objects
        custom = objects["custom_objects"] or {}
        if spec.random_seed is not None:
            keras.utils.set_random_seed(int(spec.random_seed))
        self.model = model_from_bytes(spec.model_bytes, custom)
        serialized = dict(objects["optimizer"])
        config = dict(serialized["config"])
        # Horovod: scale the learning rate by the number of ranks.
        self.base_lr = config.get("learning_rate")
        if isinstance(self.base_lr, (int, float)):
            config["learning_rate"] = float(self.base_lr) * hvd.size()
        serialized["config"] = config
        optimizer = keras.optimizers.deserialize(serialized, custom_objects=custom)
        self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            compression=objects["compression"] or hvd.Compression.none,
            backward_passes_per_step=spec.backward_passes_per_step,
            average_aggregated_gradients=True,
        )
        self.model.compile(
            optimizer=self.optimizer,
            loss=objects["loss"],
            loss_weights=objects["loss_weights"],
            metrics=objects["metrics"],
            jit_compile=False,
        )

    def _to_batch(self, batch: Dict[str, Any]) -> Any:
        """A loader batch as Keras's ``(x, y)`` or ``(x, y, sample_weight)``: features reshaped
        to the model's inputs, labels to ``label_shapes``, floats as ``keras.config.floatx()``."""
        import keras
        import numpy as np

        spec = self.spec
        floatx = keras.config.floatx()
        batch = spec.transform_batch(batch, self.objects["transformation_fn"])
        xs = []
        for i, name in enumerate(spec.feature_cols):
            x = _float_to_floatx(np.asarray(batch[name]), floatx)
            if i < len(self.input_shapes) and self.input_shapes[i] is not None:
                want = self.input_shapes[i]
                if x.shape[1:] != want and int(np.prod(x.shape[1:])) == int(np.prod(want)):
                    x = x.reshape((-1, *want))
            xs.append(x)
        ys = []
        for i, name in enumerate(spec.label_cols):
            y = _float_to_floatx(np.asarray(batch[name]), floatx)
            if spec.label_shapes:
                y = y.reshape(spec.label_shapes[i])
            ys.append(y)
        x = xs[0] if len(xs) == 1 else xs
        y = ys[0] if len(ys) == 1 else ys
        if spec.sample_weight_col:
            return x, y, _float_to_floatx(np.asarray(batch[spec.sample_weight_col]), floatx)
        return x, y

    def _resume(self, hvd: Any) -> Dict[str, Any]:
        """Rank 0 loads the run's checkpoint (if any); every rank learns where to start. The
        weights and optimizer state reach the other ranks through the broadcast callback."""
        spec = self.spec
        state = None
        if hvd.rank() == 0:
            ckpt = load_checkpoint(spec.store, spec.run_id)
            if ckpt is not None:
                saved = model_from_bytes(ckpt["model"], self.objects["custom_objects"], True)
                self.model.set_weights(saved.get_weights())
                saved_opt = saved.optimizer
                if saved_opt is not None and saved_opt.built:
                    self.optimizer.build(self.model.trainable_variables)
                    ours, theirs = self.optimizer.variables, saved_opt.variables
                    if len(ours) != len(theirs):
                        raise DataError(
                            f"the checkpoint of run {spec.run_id} holds {len(theirs)} optimizer "
                            f"variables, this optimizer has {len(ours)}: resume with the same "
                            "model and optimizer, or pick a new run_id"
                        )
                    for variable, saved_variable in zip(ours, theirs):
                        variable.assign(saved_variable)
                    self._set_lr(self._base_lr_value() * hvd.size())
                state = {
                    "epoch": int(ckpt["epoch"]) + 1,
                    "history": ckpt["history"],
                    "loader": ckpt.get("loader"),
                    "best": ckpt.get("best"),
                }
                log.info(
                    "run %s: resuming at epoch %d from its checkpoint", spec.run_id, state["epoch"]
                )
        state = hvd.broadcast_object(state, root_rank=0, name="kolo.keras_estimator.resume")
        return state or {"epoch": 0, "history": None, "loader": None, "best": None}

    def _base_lr_value(self) -> float:
        return float(self.base_lr) if isinstance(self.base_lr, (int, float)) else 0.0

    def _set_lr(self, value: float) -> None:
        if isinstance(self.base_lr, (int, float)):
            self.optimizer.learning_rate = value

    # -- the rank's function ------------------------------------------------------------------

    def __call__(self) -> Optional[Dict[str, Any]]:
        """Trains this rank (see the module docstring); rank 0 returns the model, history and
        timings, the other ranks ``None``."""
        os.environ.update({str(k): str(v) for k, v in (self.spec.backend_env or {}).items()})
        import kolo.keras as hvd  # first: it loads triton before TensorFlow

        # isort: split
        import keras

        started, started_unix = time.monotonic(), time.time()
        self.spec.prepare_process()
        hvd.init()
        self._build(hvd, keras)
        self.input_shapes = [
            tuple(t.shape[1:]) if None not in tuple(t.shape[1:]) else None
            for t in self.model.inputs
        ]
        self.train_loader, self.val_loader = self.spec.open_loaders(
            hvd.rank(), hvd.size(), to="numpy"
        )
        resume = self._resume(hvd)
        start_epoch, history = resume_position(self.train_loader, resume)
        timings = rank_timings(started, started_unix)
        spec = self.spec
        steps = spec.train_steps(self.train_loader)
        folder = tempfile.mkdtemp(prefix="kolo-keras-run-")
        best_path = self._checkpoint_callback_path(hvd, folder, resume.get("best"))
        callbacks = [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            *(self.objects["callbacks"] or []),
        ]
        if self.objects["checkpoint_callback"] is not None:
            callbacks.append(self.objects["checkpoint_callback"])
        reporter = ProgressReporter(self.send, hvd.rank(), spec.epochs)
        callbacks.append(
            _recorder(self, hvd, reporter, history, timings, steps, best_path, keras.callbacks)
        )
        validation, val_steps = None, None
        if self.val_loader is not None:
            val_steps = spec.val_steps(self.val_loader)
            validation = _dataset(self.val_loader, val_steps, self._to_batch)
        try:
            if start_epoch < spec.epochs:
                t0 = time.monotonic()
                self.model.fit(
                    _dataset(self.train_loader, steps, self._to_batch),
                    epochs=spec.epochs,
                    initial_epoch=start_epoch,
                    steps_per_epoch=steps,
                    validation_data=validation,
                    validation_steps=val_steps,
                    callbacks=callbacks,
                    shuffle=False,
                    verbose=0,
                )
                timings["train_s"] = time.monotonic() - t0 - timings["checkpoint_s"]
        finally:
            self.train_loader.close()
            if self.val_loader is not None:
                self.val_loader.close()
        if hvd.rank() != 0:
            return None
        self._set_lr(self._base_lr_value())
        if best_path is not None and os.path.exists(best_path):
            with open(best_path, "rb") as f:
                model_bytes = f.read()
        else:
            model_bytes = model_to_bytes(self.model)
        return rank_result(model_bytes, history, start_epoch, hvd.size(), timings)

    def _checkpoint_callback_path(
        self, hvd: Any, folder: str, best: Optional[bytes]
    ) -> Optional[str]:
        """Points the checkpoint callback at a local file (its best model so far restored on
        resume); the file becomes the returned model."""
        callback = self.objects["checkpoint_callback"]
        if callback is None:
            return None
        path = os.path.join(folder, "best.keras")
        callback.filepath = path
        if best is not None and hvd.rank() == 0:
            with open(path, "wb") as f:
                f.write(best)
        return path

    def checkpoint(self, hvd: Any, epoch: int, history: Dict[str, Any], best_path: Any) -> None:
        """Rank 0 writes the run's checkpoint (model with optimizer state, epoch, history, the
        loader's position and the checkpoint callback's best model)."""
        spec = self.spec
        path = checkpoint_file(spec.store, spec.run_id)
        if hvd.rank() != 0 or path is None:
            return
        best = None
        if best_path is not None and os.path.exists(best_path):
            with open(best_path, "rb") as f:
                best = f.read()
        state = {
            "model": model_to_bytes(self.model),
            "epoch": epoch,
            "history": history,
            "loader": self.train_loader.state_dict(),
            "best": best,
            "size": hvd.size(),
        }
        spec.store.write_bytes(path, cloudpickle.dumps(state))


def _recorder(
    trainer: KerasTrainer,
    hvd: Any,
    reporter: ProgressReporter,
    history: Dict[str, List[float]],
    timings: Dict[str, Any],
    steps: int,
    best_path: Optional[str],
    callbacks_module: Any,
) -> Any:
    """A Keras callback (made inside the rank) that records the averaged epoch metrics into
    ``history``, checkpoints (rank 0) and sends progress to the driver (rank 0). Listed after
    ``MetricAverageCallback`` so it sees the averaged metrics."""

    class EpochRecorder(callbacks_module.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            if timings["first_step_unix"] is None:
                timings["first_step_unix"] = time.time()
            reporter.epoch_started(epoch, steps)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            reporter.step_done(self.epoch, batch + 1, steps)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            metrics = {k: float(v) for k, v in (logs or {}).items() if k != "learning_rate"}
            for key, value in metrics.items():
                history.setdefault(key, []).append(value)
            t0 = time.monotonic()
            trainer.checkpoint(hvd, epoch, history, best_path)
            timings["checkpoint_s"] += time.monotonic() - t0
            reporter.epoch_done(epoch, metrics)
            if trainer.spec.verbose >= 2:
                log.info("rank %d epoch %d: %s", hvd.rank(), epoch, metrics)

    return EpochRecorder()
