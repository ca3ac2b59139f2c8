"""Horovod's data modules for the Keras estimator (``horovod.spark.keras.datamodule``):
:class:`PetastormDataModule` reads the prepared Parquet data with kolo's
:class:`~kolo.data.ParquetLoader` (Horovod's reads it with Petastorm);
:class:`NVTabularDataModule` needs NVTabular (GPU data loading with cuDF), which kolo does
not support: constructing it raises :class:`~kolo.exceptions.InvalidArgumentError`.

Example::

    from kolo.spark.keras.datamodule import PetastormDataModule

    with PetastormDataModule(train_dir=train_path, val_dir=val_path, train_batch_size=64,
                             schema_fields=["features", "label"]) as dm:
        for batch in dm.train_data():          # {"features": array, "label": array}
            ...
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from kolo import _core
from kolo.data import ParquetLoader, read_metadata
from kolo.exceptions import InvalidArgumentError, InvalidValueError
from kolo.spark.common.datamodule import DataModule

__all__ = ["DataModule", "NVTabularDataModule", "PetastormDataModule"]

_READER_POOL_TYPES = ("thread", "process", "dummy")


class _DataModuleLoader(ParquetLoader):
    """A ``ParquetLoader`` whose batches pass through the data module's ``transform_fn``."""

    def __init__(self, transform_fn: Optional[Callable[[Any], Any]], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._transform_fn = transform_fn

    def _process_batch(self, batch: Any) -> Any:
        return batch if self._transform_fn is None else self._transform_fn(batch)


class PetastormDataModule(DataModule):
    """Horovod's default data module of ``KerasEstimator``, reading with kolo's
    :class:`~kolo.data.ParquetLoader` (numpy batches ``{column: array}``).

    Entering it opens this rank's loaders: rank and size are kolo's when it is initialized
    (Horovod's ``hvd.rank()``/``hvd.size()``), else ``cur_shard``/``shard_count``. The
    training loader shuffles (``shuffle``, seeded by ``random_seed``) and hands out whole
    batches; the validation loader (when ``has_val``) reads in order and keeps the last
    batch. Each iteration over a loader is one epoch. ``schema_fields`` (column names, or
    fields with a ``name``) chooses the columns, all columns when ``None``.
    ``train_reader_worker_count``/``val_reader_worker_count`` are the loaders' decode
    threads. ``transform_fn`` is applied to each batch dict (Horovod applies it to each row,
    through Petastorm). ``make_dataset(reader, batch_size, is_batch_reader, shuffle=,
    cache=)``, when given, turns a loader into what :meth:`train_data`/:meth:`val_data`
    return (``is_batch_reader`` is always True: kolo's loader yields batches; ``cache`` is
    ``inmemory_cache_all``); without it they return the loaders. ``reader_pool_type``
    ``"process"`` has no effect (kolo decodes on Rust threads; a warning says so).

    Example::

        with PetastormDataModule(train_dir=train_path, val_dir=val_path, has_val=True,
                                 train_batch_size=64, random_seed=7) as dm:
            model.fit(dm.train_data(), validation_data=dm.val_data())
    """

    short_name = "petastorm"

    def __init__(
        self,
        reader_pool_type: str = "thread",
        train_reader_worker_count: int = 2,
        val_reader_worker_count: int = 2,
        make_dataset: Optional[Callable[..., Any]] = None,
        random_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if reader_pool_type not in _READER_POOL_TYPES:
            raise InvalidValueError(
                f"reader_pool_type={reader_pool_type!r} must be one of {_READER_POOL_TYPES}"
            )
        if reader_pool_type == "process":
            warnings.warn(
                "reader_pool_type='process' has no effect in kolo: the loader decodes Parquet on "
                "Rust threads (train_reader_worker_count of them)",
                stacklevel=2,
            )
        self.reader_pool_type = reader_pool_type
        self.train_reader_worker_count = train_reader_worker_count
        self.val_reader_worker_count = val_reader_worker_count
        self.make_dataset = make_dataset
        self.random_seed = random_seed
        self.is_batch_reader = True
        self.train_reader: Optional[ParquetLoader] = None
        self.val_reader: Optional[ParquetLoader] = None

    def __enter__(self) -> PetastormDataModule:
        super().__enter__()
        rank, size = self._shard()
        columns = self._columns()
        common: Dict[str, Any] = dict(
            rank=rank, size=size, to="numpy", storage_options=self.storage_options
        )
        self.train_reader = _DataModuleLoader(
            self.transform_fn,
            self.train_dir,
            columns,
            self.train_batch_size,
            shuffle=self.shuffle,
            seed=int(self.random_seed or 0),
            num_threads=max(1, int(self.train_reader_worker_count)),
            **common,
        )
        if self.has_val:
            self.val_reader = _DataModuleLoader(
                self.transform_fn,
                self.val_dir,
                columns,
                self.val_batch_size,
                shuffle=False,
                drop_last=False,
                num_threads=max(1, int(self.val_reader_worker_count)),
                **common,
            )
        return self

    def __exit__(self, type: Any, value: Any, traceback: Any) -> None:
        for reader in (self.val_reader, self.train_reader):
            if reader is not None:
                reader.close()
        self.train_reader = self.val_reader = None
        super().__exit__(type, value, traceback)

    def _shard(self) -> Tuple[int, int]:
        if _core.is_initialized():
            return _core.rank(), _core.size()
        return int(self.cur_shard), int(self.shard_count)

    def _columns(self) -> List[str]:
        if self.schema_fields is None:
            meta = read_metadata(self.train_dir, self.storage_options)
            return [name for name, info in meta.columns.items() if info.problem is None]
        return [getattr(field, "name", field) for field in self.schema_fields]

    def _entered(self, reader: Optional[ParquetLoader]) -> ParquetLoader:
        if reader is None:
            raise InvalidArgumentError(
                f"{type(self).__name__} is not open: call train_data()/val_data() inside "
                f"`with {type(self).__name__}(...) as dm:`"
            )
        return reader

    def train_data(self) -> Any:
        """This rank's training data: the loader, or ``make_dataset`` applied to it.

        Example::

            with dm:
                for batch in dm.train_data():
                    ...
        """
        reader = self._entered(self.train_reader)
        if self.make_dataset is None:
            return reader
        return self.make_dataset(
            reader,
            self.train_batch_size,
            self.is_batch_reader,
            shuffle=self.shuffle,
            cache=self.inmemory_cache_all,
        )

    def val_data(self) -> Any:
        """This rank's validation data (``None`` without ``has_val``): the loader, or
        ``make_dataset`` applied to it.

        Example::

            with dm:
                val = dm.val_data()
        """
        if not self.has_val:
            return None
        reader = self._entered(self.val_reader)
        if self.make_dataset is None:
            return reader
        return self.make_dataset(
            reader,
            self.val_batch_size,
            self.is_batch_reader,
            shuffle=False,
            cache=self.inmemory_cache_all,
        )


class NVTabularDataModule(DataModule):
    """Horovod's NVTabular data module (GPU loading of tabular data with NVTabular and
    cuDF). kolo does not support NVTabular: constructing it raises
    :class:`~kolo.exceptions.InvalidArgumentError` saying what to use instead (the default
    data module, i.e. no ``data_module=``, or :class:`PetastormDataModule`: kolo's Parquet
    loader, ``continuous_cols``/``categorical_cols`` as feature columns). The static helpers
    work: :meth:`seed_fn` and :meth:`to_dense`.

    Example::

        try:
            NVTabularDataModule(label_cols=["y"], continuous_cols=["x"], train_dir=path)
        except InvalidArgumentError as err:
            print(err)
    """

    short_name = "nvtabular"

    def __new__(
        cls,
        label_cols: Any = (),
        categorical_cols: Any = (),
        continuous_cols: Any = (),
        **kwargs: Any,
    ) -> NVTabularDataModule:
        """Raises :class:`~kolo.exceptions.InvalidArgumentError` (see the class)."""
        raise InvalidArgumentError(
            "NVTabularDataModule is not supported by kolo: it needs NVTabular (GPU data "
            "loading with cuDF), which kolo does not use. Leave data_module unset (kolo reads "
            "the prepared Parquet data with its own multi-threaded loader) or pass "
            "data_module=kolo.spark.keras.datamodule.PetastormDataModule, and list "
            "continuous_cols/categorical_cols in feature_cols"
        )

    @staticmethod
    def seed_fn() -> int:
        """A shuffle seed that every rank agrees on: rank 0's random seed, broadcast (kolo is
        initialized first, as Horovod's ``hvd.init()`` here).

        Example::

            seed = NVTabularDataModule.seed_fn()
        """
        import kolo.keras as hvd

        hvd.init()
        seed = int(np.random.randint(0, np.iinfo(np.int32).max))
        return int(hvd.broadcast_object(seed, root_rank=0, name="shuffle_seed"))

    @staticmethod
    def to_dense(X: Dict[str, Any], labels: Any) -> Tuple[Dict[str, Any], Any]:
        """``(X, labels)`` with NVTabular's ragged columns (a tuple ``(values, row_lengths)``,
        each of shape ``[n, 1]``) turned into dense arrays ``[rows, longest row]`` padded with
        zeros; other columns unchanged.

        Example::

            X, y = NVTabularDataModule.to_dense({"a": (values, lengths)}, y)
        """
        dense = {}
        for column, tensor in X.items():
            if isinstance(tensor, tuple):
                values = np.asarray(tensor[0])[:, 0]
                lengths = np.asarray(tensor[1])[:, 0].astype(np.int64)
                out = np.zeros((len(lengths), int(lengths.max(initial=0))), dtype=values.dtype)
                out[np.arange(out.shape[1]) < lengths[:, None]] = values
                dense[column] = out
            else:
                dense[column] = tensor
        return dense, labels
