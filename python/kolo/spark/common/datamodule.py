"""Horovod's ``DataModule`` (``horovod.spark.common.datamodule``): the base of the data modules
an estimator's ``data_module=`` takes. Each rank builds one with the prepared data's
directories and the loader settings, enters it, and trains on ``train_data()`` and
``val_data()``.

Example::

    from kolo.spark.common.datamodule import DataModule

    class ListDataModule(DataModule):
        def train_data(self):
            return [{"x": [1.0], "y": [0.0]}]

        def val_data(self):
            return None

    with ListDataModule(train_dir="/tmp/train", val_dir=None) as dm:
        batches = dm.train_data()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional

__all__ = ["DataModule"]


class DataModule(ABC):
    """A context manager that gives a rank its training and validation data, with Horovod's
    constructor: the directories of the prepared data, epochs, batch sizes, ``shuffle``,
    ``transform_fn``, ``inmemory_cache_all``, this rank's shard (``cur_shard`` of
    ``shard_count``), ``schema_fields`` (the columns), ``storage_options``, the steps per
    epoch and ``verbose``; other keyword arguments are accepted and ignored, as in Horovod.
    Subclasses open readers in ``__enter__``, close them in ``__exit__``, and define
    :meth:`train_data` and :meth:`val_data`.

    Example::

        with MyDataModule(train_dir=train_path, val_dir=val_path, train_batch_size=64) as dm:
            for batch in dm.train_data():
                ...
    """

    #: A short name for the implementation (``"petastorm"``, ``"nvtabular"``).
    short_name: Optional[str] = None

    def __init__(
        self,
        train_dir: str,
        val_dir: str,
        num_train_epochs: int = 1,
        has_val: bool = True,
        train_batch_size: int = 32,
        val_batch_size: int = 32,
        shuffle: bool = True,
        transform_fn: Any = None,
        inmemory_cache_all: bool = False,
        cur_shard: int = 0,
        shard_count: int = 1,
        schema_fields: Any = None,
        storage_options: Any = None,
        steps_per_epoch_train: int = 1,
        steps_per_epoch_val: int = 1,
        verbose: Any = True,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.train_dir = train_dir
        self.val_dir = val_dir
        self.num_train_epochs = num_train_epochs
        self.has_val = has_val
        self.train_batch_size = train_batch_size
        self.val_batch_size = val_batch_size
        self.shuffle = shuffle
        self.transform_fn = transform_fn
        self.inmemory_cache_all = inmemory_cache_all
        self.cur_shard = cur_shard
        self.shard_count = shard_count
        self.schema_fields = schema_fields
        self.storage_options = storage_options
        self.steps_per_epoch_train = steps_per_epoch_train
        self.steps_per_epoch_val = steps_per_epoch_val
        self.verbose = verbose

    def __enter__(self) -> DataModule:
        return self

    def __exit__(self, type: Any, value: Any, traceback: Any) -> None:  # noqa: B027
        """Closes what ``__enter__`` opened (nothing here)."""

    @abstractmethod
    def train_data(self) -> Any:
        """The training data, in the form the framework trains on."""

    @abstractmethod
    def val_data(self) -> Any:
        """The validation data, in the form the framework trains on (``None``: none)."""
