"""The per-rank training function of :class:`kolo.spark.keras.KerasEstimator` (Horovod's
``horovod.spark.keras.remote``).

:class:`KerasRemoteTrainer` is built on the driver (the model as ``.keras`` bytes, the other
user objects cloudpickled) and called once in every rank by :func:`kolo.spark.run`. Each rank
sets ``backend_env``, joins the job (``kolo.keras.init()``), rebuilds the model, compiles it
with a ``kolo.keras.DistributedOptimizer`` (learning rate multiplied by the number of ranks, as
Horovod does) and runs Keras's own ``model.fit`` on its equal share of the prepared Parquet
data (:class:`kolo.data.ParquetLoader` with ``to="numpy"``), with the broadcast and
metric-average callbacks. Rank 0 checkpoints after every epoch into
``store.get_checkpoint_path(run_id)`` (a run restarted with the same ``run_id`` resumes from
it), reports progress to the driver and returns the trained model and the history.

Example (one rank, in-process)::

    trainer = KerasRemoteTrainer(spec)   # spec: a KerasTrainingSpec, built by KerasEstimator
    result = trainer()                   # {"model": <.keras bytes>, "history": {...}, ...}
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import cloudpickle

from kolo.exceptions import DataError
from kolo.spark.common.launch import (
    PROGRESS_INTERVAL_S,
    rank_timings,
    resume_position,
    spark_send,
)
from kolo.spark.keras.serde import model_from_bytes, model_to_bytes

__all__ = ["KerasRemoteTrainer", "KerasTrainingSpec", "load_checkpoint"]

log = logging.getLogger(__name__)


@dataclass
class KerasTrainingSpec:
    """Everything a rank needs to train; user objects are bytes (see the module docstring)."""

    model_bytes: bytes
    #: cloudpickled dict: optimizer (``keras.optimizers.serialize``), loss, loss_weights, metrics,
    #: callbacks, custom_objects, checkpoint_callback, transformation_fn, compression.
    objects_bytes: bytes
    backend_env: Dict[str, str]
    store: Any
    run_id: str
    train_path: str
    val_path: Optional[str]
    feature_cols: List[str]
    label_cols: List[str]
    sample_weight_col: Optional[str]
    label_shapes: Optional[List[List[int]]]
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps_per_epoch: Optional[int]
    validation_steps_per_epoch: Optional[int]
    shuffle: bool
    shuffle_buffer_size: Optional[int]
    random_seed: Optional[int]
    backward_passes_per_step: int
    verbose: int
    train_reader_num_workers: int
    val_reader_num_workers: int
    storage_options: Dict[str, str] = field(default_factory=dict)


def load_checkpoint(store: Any, run_id: str) -> Optional[Dict[str, Any]]:
    """The checkpoint of ``run_id`` in ``store``: ``model`` (``.keras`` bytes, optimizer state
    included), ``epoch`` (the last finished epoch, 0-based), ``history``, ``loader`` and
    ``best`` (the checkpoint callback's file, if any); ``None`` when there is none.

    Example::

        ckpt = load_checkpoint(store, "run_1")
        print(ckpt["epoch"], ckpt["history"]["loss"])
    """
    path = store.get_checkpoint_path(run_id)
    if path is None or not store.exists(path):
        return None
    return cloudpickle.loads(store.read(path))


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


class KerasRemoteTrainer:
    """The function every rank runs (picklable; see the module docstring).

    ``send(obj)`` delivers rank 0's progress messages to the driver (default:
    :func:`~kolo.spark.common.launch.spark_send`).

    Example::

        trainer = KerasRemoteTrainer(spec, send=print)
    """

    def __init__(self, spec: KerasTrainingSpec, send: Optional[Callable[[Any], None]] = None):
        self.spec = spec
        self.send = send or spark_send

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

    def _loaders(self, hvd: Any) -> None:
        from kolo.data import ParquetLoader

        spec = self.spec
        columns = [*spec.feature_cols, *spec.label_cols]
        if spec.sample_weight_col:
            columns.append(spec.sample_weight_col)
        self.columns = list(dict.fromkeys(columns))
        seed = 0 if spec.random_seed is None else int(spec.random_seed)
        common = dict(rank=hvd.rank(), size=hvd.size(), seed=seed, to="numpy")
        self.train_loader = ParquetLoader(
            spec.train_path,
            self.columns,
            batch_size=spec.batch_size,
            shuffle=spec.shuffle,
            drop_last=True,
            storage_options=spec.storage_options or None,
            shuffle_buffer_size=spec.shuffle_buffer_size,
            num_threads=max(1, spec.train_reader_num_workers),
            **common,
        )
        self.val_loader = None
        if spec.val_path:
            self.val_loader = ParquetLoader(
                spec.val_path,
                self.columns,
                batch_size=spec.val_batch_size,
                shuffle=False,
                drop_last=False,
                storage_options=spec.storage_options or None,
                num_threads=max(1, spec.val_reader_num_workers),
                **common,
            )

    def _to_batch(self, batch: Dict[str, Any]) -> Any:
        """A loader batch as Keras's ``(x, y)`` or ``(x, y, sample_weight)``: features reshaped
        to the model's inputs, labels to ``label_shapes``, floats as ``keras.config.floatx()``."""
        import keras
        import numpy as np

        spec = self.spec
        floatx = keras.config.floatx()
        transform = self.objects["transformation_fn"]
        if transform is not None:
            batch = transform(batch)
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
        os.environ.update({str(k): str(v) for k, v in (self.spec.backend_env or {}).items()})
        import kolo.keras as hvd  # first: it loads triton before TensorFlow

        # isort: split
        import keras

        started, started_unix = time.monotonic(), time.time()
        hvd.init()
        self._build(hvd, keras)
        self.input_shapes = [
            tuple(t.shape[1:]) if None not in tuple(t.shape[1:]) else None
            for t in self.model.inputs
        ]
        self._loaders(hvd)
        resume = self._resume(hvd)
        start_epoch, history = resume_position(self.train_loader, resume)
        timings = rank_timings(started, started_unix)
        spec = self.spec
        steps = spec.train_steps_per_epoch or len(self.train_loader)
        folder = tempfile.mkdtemp(prefix="kolo-keras-run-")
        best_path = self._checkpoint_callback_path(hvd, folder, resume.get("best"))
        callbacks = [
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            *(self.objects["callbacks"] or []),
        ]
        if self.objects["checkpoint_callback"] is not None:
            callbacks.append(self.objects["checkpoint_callback"])
        callbacks.append(_reporter(self, hvd, history, timings, steps, best_path, keras.callbacks))
        validation, val_steps = None, None
        if self.val_loader is not None:
            val_steps = spec.validation_steps_per_epoch or len(self.val_loader)
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
        timings["returned_unix"] = time.time()
        return {
            "model": model_bytes,
            "history": history,
            "start_epoch": start_epoch,
            "size": hvd.size(),
            "timings": timings,
        }

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
        path = spec.store.get_checkpoint_path(spec.run_id)
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


def _reporter(
    trainer: KerasRemoteTrainer,
    hvd: Any,
    history: Dict[str, List[float]],
    timings: Dict[str, Any],
    steps: int,
    best_path: Optional[str],
    callbacks_module: Any,
) -> Any:
    """A Keras callback (made inside the rank) that records the averaged epoch metrics into
    ``history``, checkpoints (rank 0) and sends progress to the driver (rank 0). Listed after
    ``MetricAverageCallback`` so it sees the averaged metrics."""

    class RankZeroReporter(callbacks_module.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.last_report = 0.0
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch
            if timings["first_step_unix"] is None:
                timings["first_step_unix"] = time.time()
            if hvd.rank() == 0:
                trainer.send({"kind": "step", "epoch": epoch, "step": 0, "steps": steps})

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            now = time.monotonic()
            if hvd.rank() == 0 and now - self.last_report >= PROGRESS_INTERVAL_S:
                self.last_report = now
                trainer.send(
                    {"kind": "step", "epoch": self.epoch, "step": batch + 1, "steps": steps}
                )

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            metrics = {k: float(v) for k, v in (logs or {}).items() if k != "learning_rate"}
            for key, value in metrics.items():
                history.setdefault(key, []).append(value)
            t0 = time.monotonic()
            trainer.checkpoint(hvd, epoch, history, best_path)
            timings["checkpoint_s"] += time.monotonic() - t0
            if hvd.rank() == 0:
                trainer.send(
                    {
                        "kind": "epoch",
                        "epoch": epoch,
                        "epochs": trainer.spec.epochs,
                        "metrics": metrics,
                    }
                )
            if trainer.spec.verbose >= 2:
                log.info("rank %d epoch %d: %s", hvd.rank(), epoch, metrics)

    return RankZeroReporter()
