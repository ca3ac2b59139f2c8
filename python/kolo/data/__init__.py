"""kolo's data path: Parquet datasets prepared into a store and read back as shuffled,
equal-size shards of numpy arrays or torch tensors; and Horovod's loader bases
(``horovod.data``): ``BaseDataLoader`` and ``AsyncDataLoaderMixin``.

Example::

    from kolo.data import ParquetLoader

    for batch in ParquetLoader("/tmp/data", ["features", "label"], batch_size=256, rank=0, size=1):
        print(batch["features"].shape)
"""

from kolo.data.data_loader_base import AsyncDataLoaderMixin, BaseDataLoader
from kolo.data.loader import ParquetLoader
from kolo.data.metadata import ColumnInfo, ColumnSpec, DatasetMetadata, FileInfo, read_metadata
from kolo.data.prepare import PreparedData, prepare_data

__all__ = [
    "AsyncDataLoaderMixin",
    "BaseDataLoader",
    "ColumnInfo",
    "ColumnSpec",
    "DatasetMetadata",
    "FileInfo",
    "ParquetLoader",
    "PreparedData",
    "prepare_data",
    "read_metadata",
]
