"""The Lightning estimator's per-rank training loop (Horovod's
``horovod.spark.lightning.remote``), launcher-neutral (:class:`kolo.spark.lightning.TorchEstimator`
runs it under :func:`kolo.spark.run`).

:class:`LightningTrainer` is built on the driver (user objects cloudpickled to bytes), shipped
by the launcher and called once in every rank. Each rank joins the job,
rebuilds the LightningModule and runs ``lightning.pytorch.Trainer(strategy=KoloStrategy())``
on its equal share of the prepared Parquet data: batches are dicts ``{column: tensor}`` (as in
Horovod), features and labels reshaped by ``input_shapes``/``label_shapes`` and float64 given
as float32. After every epoch the ranks write a Lightning checkpoint (rank 0 uploads it to the
run's checkpoint file, :func:`~kolo.estimator.spec.checkpoint_file`; a later fit with the same
``run_id`` resumes from it), record the epoch's logged metrics (``trainer.callback_metrics``)
as the history and rank 0 reports progress to the driver. Rank 0 returns the trained weights
and the history.

Example (one rank, in-process)::

    trainer = LightningTrainer(spec)   # spec: a LightningSpec, built by the estimator
    result = trainer()                 # {"model": <state_dict bytes>, "history": {...}}
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import cloudpickle

from kolo.estimator.progress import ProgressReporter, rank_result, send_progress
from kolo.estimator.spec import TrainingSpec, checkpoint_bytes, checkpoint_file
from kolo.estimator.torch_trainer import state_bytes, tensorboard_without_tensorflow

__all__ = ["LightningSpec", "LightningTrainer"]

log = logging.getLogger(__name__)

#: The folder under a rank's local directory that is synced into the run's folder in the store
#: (the TensorBoard logs); the checkpoint files beside it are uploaded on their own.
_SYNCED = "run"


@dataclass
class LightningSpec(TrainingSpec):
    """A :class:`~kolo.estimator.spec.TrainingSpec` plus the Lightning objects, cloudpickled
    (``*_bytes``), and Horovod's Lightning parameters.

    Example::

        spec = LightningSpec(**spec_fields(param, store, run_id, meta), model_bytes=..., ...)
    """

    model_bytes: bytes
    callbacks_bytes: bytes
    logger_bytes: bytes
    profiler_bytes: bytes
    trainer_args_bytes: bytes
    transformation_fn_bytes: bytes
    input_shapes: Optional[List[List[int]]]
    gradient_compression: Any
    use_gpu: bool
    num_gpus: Optional[int]
    log_every_n_steps: int
    terminate_on_nan: bool
    loader_num_epochs: Optional[int]

    def lightning_data_module_kwargs(self, rank: int, size: int) -> Dict[str, Any]:
        """The keyword arguments Horovod's Lightning ranks build their ``data_module`` (a
        ``LightningDataModule`` class) with (``horovod/spark/lightning/remote.py``).

        Example::

            dm = MyDataModule(**spec.lightning_data_module_kwargs(hvd.rank(), hvd.size()))
        """
        train_steps, val_steps = self._data_module_steps(size)
        return {
            "train_dir": self.train_path,
            "val_dir": self.val_path,
            "num_train_epochs": self.epochs,
            "has_val": self.val_path is not None,
            "train_batch_size": self.batch_size,
            "val_batch_size": self.val_batch_size,
            "shuffle": self.shuffle,
            "num_reader_epochs": self.loader_num_epochs,
            "reader_pool_type": self.reader_pool_type,
            "reader_worker_count": self.train_reader_num_workers,
            "transformation": cloudpickle.loads(self.transformation_fn_bytes),
            "transformation_edit_fields": self.transformation_edit_fields,
            "transformation_removed_fields": self.transformation_removed_fields,
            "inmemory_cache_all": self.inmemory_cache_all,
            "cur_shard": rank,
            "shard_count": size,
            "schema_fields": self.columns(),
            "storage_options": self.storage_options,
            "steps_per_epoch_train": train_steps,
            "steps_per_epoch_val": val_steps,
            "verbose": self.verbose,
            "debug_data_loader": self.debug_data_loader,
            "train_async_data_loader_queue_size": self.train_async_data_loader_queue_size,
            "val_async_data_loader_queue_size": self.val_async_data_loader_queue_size,
            "seed": self.random_seed,
        }


class _Batches:
    """An epoch of exactly ``steps`` batches (dicts column → tensor) from a kolo
    ``ParquetLoader``, going on into the loader's next epoch when needed; ``len()`` is
    ``steps``, the same on every rank."""

    def __init__(self, loader: Any, steps: int, convert: Callable[[Dict[str, Any]], Any]) -> None:
        self.loader = loader
        self.steps = steps
        self.convert = convert
        self._source: Optional[Iterator[Dict[str, Any]]] = None

    def _endless(self) -> Iterator[Dict[str, Any]]:
        while True:
            yield from self.loader

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        if self._source is None:
            self._source = self._endless()
        for _ in range(self.steps):
            yield self.convert(next(self._source))


def _steps(trainer: Any) -> Optional[int]:
    steps = trainer.num_training_batches
    return int(steps) if math.isfinite(steps) else None


def _history_callback(
    spec: LightningSpec, reporter: ProgressReporter, sync: Optional[Callable], local_dir: str
) -> Any:
    """A Lightning callback that records each epoch's logged metrics, checkpoints into the
    store and reports progress (built here so that Lightning is imported in the rank only)."""
    import lightning.pytorch as pl
    import torch

    from kolo.exceptions import DataError

    class _KoloEpochEnd(pl.Callback):
        def __init__(self) -> None:
            self.history: Dict[str, List[float]] = {}
            self.first_step_unix: Optional[float] = None
            self.start_epoch = 0
            self.checkpoint_s = 0.0

        @property
        def state_key(self) -> str:
            return "kolo_history"

        def state_dict(self) -> Dict[str, Any]:
            return {"history": self.history}

        def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
            self.history = {k: list(v) for k, v in state_dict.get("history", {}).items()}

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.start_epoch = trainer.current_epoch

        def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
            reporter.epoch_started(trainer.current_epoch, _steps(trainer))

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            if self.first_step_unix is None:
                self.first_step_unix = time.time()

        def on_train_batch_end(
            self, trainer: Any, module: Any, outputs: Any, batch: Any, idx: int
        ) -> None:
            if spec.terminate_on_nan:
                loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
                if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
                    raise DataError(
                        f"the training loss is {float(loss)} at epoch {trainer.current_epoch} "
                        f"step {idx} (terminate_on_nan=True): lower the learning rate, clip "
                        "gradients (trainer_args={'gradient_clip_val': ...}) or check the data"
                    )
            reporter.step_done(trainer.current_epoch, idx + 1, _steps(trainer))

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            metrics = {}
            for key, value in trainer.callback_metrics.items():
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    metrics[key] = float(value)
                elif isinstance(value, (int, float)):
                    metrics[key] = float(value)
            for key, value in metrics.items():
                self.history.setdefault(key, []).append(value)
            started = time.monotonic()
            # Every rank takes part (Lightning's save_checkpoint has a barrier); rank 0 writes.
            path = os.path.join(local_dir, "epoch.ckpt")
            trainer.save_checkpoint(path, weights_only=False)
            if trainer.global_rank == 0:
                target = checkpoint_file(spec.store, spec.run_id)
                if target is not None:
                    with open(path, "rb") as f:
                        spec.store.write_bytes(target, f.read())
                if sync is not None:
                    sync(os.path.join(local_dir, _SYNCED))
            reporter.epoch_done(trainer.current_epoch, metrics)
            self.checkpoint_s += time.monotonic() - started
            if spec.verbose >= 2:
                log.info(
                    "rank %d epoch %d: %s", trainer.global_rank, trainer.current_epoch, metrics
                )

    return _KoloEpochEnd()


class LightningTrainer:
    """The function every rank runs (picklable; see the module docstring).

    ``send(obj)`` delivers rank 0's progress messages to the driver, best effort (default:
    :func:`kolo.estimator.progress.send_progress`).

    Example::

        trainer = LightningTrainer(spec, send=print)
    """

    def __init__(self, spec: LightningSpec, send: Optional[Callable[[Any], None]] = None) -> None:
        self.spec = spec
        self.send = send or send_progress

    def _convert(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        import torch

        spec = self.spec
        batch = dict(spec.transform_batch(batch, self.transformation_fn))
        for cols, shapes in (
            (spec.feature_cols, spec.input_shapes),
            (spec.label_cols, spec.label_shapes),
        ):
            for i, col in enumerate(cols):
                value = batch.get(col)
                if not isinstance(value, torch.Tensor):
                    continue
                if value.dtype == torch.float64:
                    value = value.float()
                batch[col] = value.reshape(shapes[i]) if shapes else value
        return batch

    def _resume(self, hvd: Any, local_dir: str) -> Optional[str]:
        """A local copy of the run's checkpoint (rank 0 reads it, every rank gets it)."""
        spec = self.spec
        data = None
        if hvd.rank() == 0:
            data = checkpoint_bytes(spec.store, spec.run_id)
            if data is not None:
                log.info("run %s: resuming from its checkpoint", spec.run_id)
        data = hvd.broadcast_object(data, root_rank=0, name="kolo.lightning.resume")
        if data is None:
            return None
        local = os.path.join(local_dir, "resume.ckpt")
        with open(local, "wb") as f:
            f.write(data)
        return local

    def _accelerator(self) -> str:
        import torch

        spec = self.spec
        if spec.num_gpus == 0 or not spec.use_gpu or not torch.cuda.is_available():
            return "cpu"
        return "gpu"

    def _logger(self, local_dir: str) -> Any:
        spec = self.spec
        logger = cloudpickle.loads(spec.logger_bytes)
        if logger is not None:
            return logger
        if spec.store.get_logs_path(spec.run_id) is None:
            return False
        tensorboard_without_tensorflow()
        try:
            from lightning.pytorch.loggers import TensorBoardLogger

            logs = os.path.join(local_dir, _SYNCED, spec.store.get_logs_subdir())
            return TensorBoardLogger(save_dir=logs, name="", version="")
        except ModuleNotFoundError:
            log.info("tensorboard is not installed: no event logs for run %s", spec.run_id)
            return False

    def __call__(self) -> Optional[Dict[str, Any]]:
        """Trains this rank (see the module docstring); rank 0 returns the weights, history and
        timings, the other ranks ``None``."""
        import lightning.pytorch as pl
        import torch

        import kolo.torch as hvd
        from kolo.lightning import KoloStrategy

        started_unix = time.time()
        self.spec.prepare_process()
        hvd.init()
        spec = self.spec
        if spec.random_seed is not None:
            torch.manual_seed(spec.random_seed)
        model = cloudpickle.loads(spec.model_bytes)
        self.transformation_fn = cloudpickle.loads(spec.transformation_fn_bytes)
        data_module = cloudpickle.loads(spec.data_module_bytes)
        train = val = None
        if data_module is None:
            train, val = spec.open_loaders(hvd.rank(), hvd.size())
        local_dir = tempfile.mkdtemp(prefix="kolo-lightning-")
        try:
            ckpt_path = self._resume(hvd, local_dir)
            logger = self._logger(local_dir)
            sync = None
            if hvd.rank() == 0 and logger is not False:
                sync = spec.store.sync_fn(spec.run_id)
            reporter = ProgressReporter(self.send, hvd.rank(), spec.epochs)
            recorder = _history_callback(spec, reporter, sync, local_dir)
            callbacks = list(cloudpickle.loads(spec.callbacks_bytes) or [])
            args: Dict[str, Any] = dict(
                max_epochs=spec.epochs,
                log_every_n_steps=spec.log_every_n_steps,
                enable_progress_bar=spec.verbose >= 2,
                enable_model_summary=spec.verbose >= 2,
                enable_checkpointing=False,
                num_sanity_val_steps=0,
                default_root_dir=local_dir,
                accumulate_grad_batches=spec.backward_passes_per_step,
            )
            args.update(cloudpickle.loads(spec.trainer_args_bytes) or {})
            args.update(
                strategy=KoloStrategy(compression=spec.gradient_compression),
                accelerator=self._accelerator(),
                devices=1,
                num_nodes=1,
                logger=logger,
                callbacks=[*callbacks, recorder],
                profiler=cloudpickle.loads(spec.profiler_bytes),
            )
            trainer = pl.Trainer(**args)
            started = time.monotonic()
            if data_module is not None:
                kwargs = spec.lightning_data_module_kwargs(hvd.rank(), hvd.size())
                if spec.debug_data_loader and hvd.rank() == 0:
                    log.info("creating the data module with %s", kwargs)
                trainer.fit(model, datamodule=data_module(**kwargs), ckpt_path=ckpt_path)
            else:
                train_batches = _Batches(train, spec.train_steps(train), self._convert)
                val_batches = None
                if val is not None:
                    val_batches = _Batches(val, spec.val_steps(val), self._convert)
                trainer.fit(model, train_batches, val_batches, ckpt_path=ckpt_path)
            train_s = time.monotonic() - started
            if sync is not None:  # what the logger wrote after the last epoch
                sync(os.path.join(local_dir, _SYNCED))
        finally:
            for loader in (train, val):
                if loader is not None:
                    loader.close()
            shutil.rmtree(local_dir, ignore_errors=True)
        if hvd.rank() != 0:
            return None
        timings = {
            "started_unix": started_unix,
            "first_step_unix": recorder.first_step_unix,
            "train_s": train_s - recorder.checkpoint_s,
            "checkpoint_s": recorder.checkpoint_s,
        }
        history, start_epoch = recorder.history, recorder.start_epoch
        return rank_result(state_bytes(model), history, start_epoch, hvd.size(), timings)
