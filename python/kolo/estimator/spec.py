"""What a rank needs to train, whatever the framework: :class:`TrainingSpec`, the base of the
framework specs (:class:`~kolo.estimator.torch_trainer.TorchSpec`,
:class:`~kolo.estimator.lightning_trainer.LightningSpec`,
:class:`~kolo.estimator.keras_trainer.KerasSpec`). The driver builds one from an estimator's
parameters (:func:`spec_fields` fills the shared fields) and ships it to every rank inside the
trainer; the rank opens its share of the data with :meth:`TrainingSpec.open_loaders`.

Example::

    fields = spec_fields(params.get, store, "run_1", meta)
    spec = TorchSpec(**fields, model_bytes=..., ...)
    train_loader, val_loader = spec.open_loaders(hvd.rank(), hvd.size())
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import cloudpickle

from kolo.estimator.checks import FIX_FN, check_shapes, pickled

__all__ = [
    "READER_POOL_TYPES",
    "ParamGetter",
    "TrainingSpec",
    "checkpoint_bytes",
    "checkpoint_file",
    "spec_fields",
]

log = logging.getLogger(__name__)

#: Horovod's (petastorm's) ``reader_pool_type`` values.
READER_POOL_TYPES = ("thread", "process", "dummy")

#: ``param(name)``: the value of an estimator parameter (``batch_size``, ``loss``, ...).
ParamGetter = Callable[[str], Any]


@dataclass
class TrainingSpec:
    """The fields every framework's spec has (the framework specs add theirs after these).

    Example::

        spec.columns()            # ["features", "label"]
        spec.open_loaders(0, 2)   # (train loader, validation loader or None)
    """

    store: Any
    run_id: str
    train_path: str
    #: ``None`` when there is no validation data (or it has no rows).
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
    #: Options of the store's object store (credentials, endpoint) for the loaders.
    storage_options: Dict[str, str]
    train_rows: int
    val_rows: int
    continuous_cols: Optional[List[str]]
    categorical_cols: Optional[List[str]]
    transformation_edit_fields: Optional[List[Tuple[Any, ...]]]
    transformation_removed_fields: Optional[List[str]]
    #: The user's data module class (cloudpickled), or ``None``: kolo's Parquet loader.
    data_module_bytes: bytes
    reader_pool_type: str
    inmemory_cache_all: bool
    mp_start_method: Optional[str]
    debug_data_loader: bool
    train_async_data_loader_queue_size: Optional[int]
    val_async_data_loader_queue_size: Optional[int]

    def columns(self) -> List[str]:
        """The columns a rank reads, each once: features, labels, the sample weight column."""
        columns = [*self.feature_cols, *self.label_cols]
        if self.sample_weight_col:
            columns.append(self.sample_weight_col)
        return list(dict.fromkeys(columns))

    def open_loaders(self, rank: int, size: int, **options: Any) -> Tuple[Any, Optional[Any]]:
        """This rank's loader of the training data (shuffled when ``shuffle``, whole batches
        only) and of the validation data (in order, last batch kept; ``None`` without
        validation data): :class:`kolo.data.ParquetLoader` with Horovod's loader parameters
        applied (``reader_pool_type``, ``*_reader_num_workers``, ``*_async_data_loader_queue_size``,
        ``inmemory_cache_all``, ``debug_data_loader``), or the batches of the user's
        ``data_module``. ``options`` go to both ParquetLoaders (e.g. ``to="numpy"``).

        Example::

            train, val = spec.open_loaders(hvd.rank(), hvd.size(), to="numpy")
        """
        from kolo.data import ParquetLoader
        from kolo.estimator._loaders import CachedLoader, DebugLoader

        data_module = cloudpickle.loads(self.data_module_bytes)
        if data_module is not None:
            return self._data_module_loaders(data_module, rank, size)
        columns = self.columns()
        seed = 0 if self.random_seed is None else int(self.random_seed)
        common = dict(
            rank=rank,
            size=size,
            seed=seed,
            storage_options=self.storage_options or None,
            **options,
        )
        if self.debug_data_loader:
            log.info(
                "rank %d loaders: columns %s, reader_pool_type %s, reader threads %d/%d, "
                "queue sizes %s/%s, inmemory_cache_all %s",
                rank,
                columns,
                self.reader_pool_type,
                self._threads(self.train_reader_num_workers),
                self._threads(self.val_reader_num_workers),
                self.train_async_data_loader_queue_size,
                self.val_async_data_loader_queue_size,
                self.inmemory_cache_all,
            )
        loaders: List[Any] = [
            ParquetLoader(
                self.train_path,
                columns,
                batch_size=self.batch_size,
                shuffle=self.shuffle,
                drop_last=True,
                shuffle_buffer_size=self.shuffle_buffer_size,
                num_threads=self._threads(self.train_reader_num_workers),
                prefetch=self.train_async_data_loader_queue_size or 2,
                **common,
            )
        ]
        if self.val_path:
            loaders.append(
                ParquetLoader(
                    self.val_path,
                    columns,
                    batch_size=self.val_batch_size,
                    shuffle=False,
                    drop_last=False,
                    num_threads=self._threads(self.val_reader_num_workers),
                    prefetch=self.val_async_data_loader_queue_size or 2,
                    **common,
                )
            )
        batch_sizes = [self.batch_size, self.val_batch_size]
        if self.inmemory_cache_all:
            loaders = [
                CachedLoader(loader, batch, shuffle=self.shuffle and i == 0, seed=seed)
                for i, (loader, batch) in enumerate(zip(loaders, batch_sizes))
            ]
        if self.debug_data_loader:
            loaders = [
                DebugLoader(loader, name, rank) for loader, name in zip(loaders, ("train", "val"))
            ]
        return loaders[0], (loaders[1] if len(loaders) > 1 else None)

    def _threads(self, workers: int) -> int:
        """Decode threads: one for petastorm's in-line ``'dummy'`` pool, else ``workers``."""
        return 1 if self.reader_pool_type == "dummy" else max(1, int(workers))

    def data_module_kwargs(self, rank: int, size: int) -> Dict[str, Any]:
        """The keyword arguments Horovod's torch and Keras ranks build their ``data_module``
        with (``horovod/spark/torch/remote.py``), for kolo's prepared data.

        Example::

            dm = MyDataModule(**spec.data_module_kwargs(hvd.rank(), hvd.size()))
        """
        return {
            "label_cols": self.label_cols,
            "continuous_cols": self.continuous_cols,
            "categorical_cols": self.categorical_cols,
            "random_seed": self.random_seed,
            "train_dir": self.train_path,
            "val_dir": self.val_path,
            "num_train_epochs": self.epochs,
            "has_val": self.val_path is not None,
            "train_batch_size": self.batch_size,
            "val_batch_size": self.val_batch_size,
            "shuffle": self.shuffle,
            "reader_pool_type": self.reader_pool_type,
            "train_reader_worker_count": self.train_reader_num_workers,
            "val_reader_worker_count": self.val_reader_num_workers,
            "transform_fn": None,
            "inmemory_cache_all": self.inmemory_cache_all,
            "cur_shard": rank,
            "shard_count": size,
            "schema_fields": self.columns(),
            "storage_options": self.storage_options,
            "steps_per_epoch_train": self._data_module_steps(size)[0],
            "steps_per_epoch_val": self._data_module_steps(size)[1],
            "verbose": self.verbose,
        }

    def _data_module_steps(self, size: int) -> Tuple[int, int]:
        """Horovod's steps per epoch with a data module: ``floor(train_rows / batch_size /
        size)`` and ``ceil(val_rows / val_batch_size / size)`` unless set."""
        train = self.train_steps_per_epoch or max(1, self.train_rows // self.batch_size // size)
        val = self.validation_steps_per_epoch or max(
            1, math.ceil(self.val_rows / self.val_batch_size / size)
        )
        return int(train), int(val)

    def _data_module_loaders(
        self, data_module: Any, rank: int, size: int
    ) -> Tuple[Any, Optional[Any]]:
        from kolo.estimator._loaders import DataModuleLoader

        dm = data_module(**self.data_module_kwargs(rank, size))
        entered = dm.__enter__() if hasattr(dm, "__enter__") else dm
        leave = getattr(dm, "__exit__", None)
        train_steps, val_steps = self._data_module_steps(size)
        train = DataModuleLoader(
            entered.train_data(), train_steps, (lambda: leave(None, None, None)) if leave else None
        )
        val = None
        if self.val_path:
            val = DataModuleLoader(entered.val_data(), val_steps, None)
        return train, val

    def transform_batch(self, batch: Any, transformation_fn: Optional[Callable]) -> Any:
        """``transformation_fn(batch)``, then Horovod's ``transformation_edit_fields`` (each
        ``(name, numpy_dtype, shape, is_nullable)`` field cast to its dtype and reshaped to
        ``[-1, *shape]``) and ``transformation_removed_fields`` (dropped).

        Example::

            batch = spec.transform_batch(batch, self.transformation_fn)
        """
        if transformation_fn is not None:
            batch = transformation_fn(batch)
        if not (self.transformation_edit_fields or self.transformation_removed_fields):
            return batch
        batch = dict(batch)
        for field in self.transformation_edit_fields or []:
            name, dtype, shape = field[0], field[1], field[2]
            if name in batch:
                batch[name] = _cast(batch[name], dtype, shape)
        for name in self.transformation_removed_fields or []:
            batch.pop(name, None)
        return batch

    def prepare_process(self) -> None:
        """What a rank sets before training: the ``mp_start_method`` (as Horovod's ranks do).

        Example::

            spec.prepare_process()
        """
        if self.mp_start_method:
            import multiprocessing

            multiprocessing.set_start_method(self.mp_start_method, force=True)

    def train_steps(self, loader: Any) -> int:
        """Training steps per epoch: ``train_steps_per_epoch``, else one pass of ``loader``."""
        return int(self.train_steps_per_epoch or len(loader))

    def val_steps(self, loader: Any) -> int:
        """Validation steps per epoch: ``validation_steps_per_epoch``, else one pass."""
        return int(self.validation_steps_per_epoch or len(loader))


def _cast(value: Any, dtype: Any, shape: Any) -> Any:
    """``value`` (a torch tensor or numpy array) as numpy ``dtype``, reshaped to
    ``[-1, *shape]`` when ``shape`` is given."""
    import numpy as np

    np_dtype = np.dtype(dtype)
    if type(value).__module__.startswith("torch"):
        import torch

        value = value.to(torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype)
    else:
        value = np.asarray(value).astype(np_dtype, copy=False)
    if shape is not None:
        value = value.reshape((-1, *shape))
    return value


def checkpoint_file(store: Any, run_id: str) -> Optional[str]:
    """The path of run ``run_id``'s checkpoint file in ``store``: the checkpoint directory
    joined with the file name, as Horovod's estimators join them
    (``store.get_checkpoint_path(run_id)`` + ``store.get_checkpoint_filename()``); ``None``
    when the store keeps no runs.

    Example::

        checkpoint_file(store, "run_1")     # '/tmp/exp/runs/run_1/checkpoint'
    """
    directory = store.get_checkpoint_path(run_id)
    if directory is None:
        return None
    return f"{directory.rstrip('/')}/{store.get_checkpoint_filename()}"


def checkpoint_bytes(store: Any, run_id: str) -> Optional[bytes]:
    """The bytes of run ``run_id``'s checkpoint file in ``store`` (:func:`checkpoint_file`),
    or ``None`` when there is none.

    Example::

        data = checkpoint_bytes(store, "run_1")
    """
    path = checkpoint_file(store, run_id)
    if path is None or not store.exists(path):
        return None
    return store.read(path)


def spec_fields(param: ParamGetter, store: Any, run_id: str, meta: Any) -> Dict[str, Any]:
    """The :class:`TrainingSpec` fields of an estimator's parameters (``param(name)`` gives
    each, by the Spark estimator's names) for the prepared data ``meta`` (a
    :class:`~kolo.estimator.dataset.PreparedDataset`); checks ``label_shapes``
    (:class:`~kolo.exceptions.InvalidArgumentError`).

    Example::

        spec = KerasSpec(**spec_fields(est._param, store, "run_1", meta), model_bytes=...)
    """
    from kolo.exceptions import InvalidValueError

    label_cols = list(param("label_cols"))
    check_shapes(param("label_shapes"), label_cols, "label_shapes", "label")
    reader_pool_type = param("reader_pool_type") or "thread"
    if reader_pool_type not in READER_POOL_TYPES:
        raise InvalidValueError(
            f"reader_pool_type={reader_pool_type!r}: give one of "
            f"{', '.join(repr(t) for t in READER_POOL_TYPES)}"
        )
    method = param("mp_start_method")
    if method is not None and method not in ("fork", "spawn", "forkserver"):
        raise InvalidValueError(
            f"mp_start_method={method!r}: give 'fork', 'spawn' or 'forkserver' (or None)"
        )
    options = store.native_location()[1] if hasattr(store, "native_location") else {}
    return dict(
        store=store,
        run_id=run_id,
        train_path=meta.train_path,
        val_path=meta.usable_val_path,
        feature_cols=list(param("feature_cols")),
        label_cols=label_cols,
        sample_weight_col=param("sample_weight_col"),
        label_shapes=param("label_shapes"),
        batch_size=param("batch_size"),
        val_batch_size=param("val_batch_size") or param("batch_size"),
        epochs=param("epochs"),
        train_steps_per_epoch=param("train_steps_per_epoch"),
        validation_steps_per_epoch=param("validation_steps_per_epoch"),
        shuffle=param("shuffle"),
        shuffle_buffer_size=param("shuffle_buffer_size"),
        random_seed=param("random_seed"),
        backward_passes_per_step=param("backward_passes_per_step"),
        verbose=param("verbose"),
        train_reader_num_workers=param("train_reader_num_workers"),
        val_reader_num_workers=param("val_reader_num_workers"),
        storage_options=dict(options),
        train_rows=int(meta.train_rows),
        val_rows=int(meta.val_rows),
        continuous_cols=param("continuous_cols"),
        categorical_cols=param("categorical_cols"),
        transformation_edit_fields=param("transformation_edit_fields"),
        transformation_removed_fields=param("transformation_removed_fields"),
        data_module_bytes=pickled("data_module", param("data_module"), FIX_FN),
        reader_pool_type=reader_pool_type,
        inmemory_cache_all=bool(param("inmemory_cache_all")),
        mp_start_method=param("mp_start_method"),
        debug_data_loader=bool(param("debug_data_loader")),
        train_async_data_loader_queue_size=param("train_async_data_loader_queue_size"),
        val_async_data_loader_queue_size=param("val_async_data_loader_queue_size"),
    )
