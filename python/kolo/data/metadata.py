"""Dataset metadata read from Parquet footers: rows, bytes, files, row groups and, per column,
its dtype and shape (array lengths are checked by reading list columns once).

The metadata is cached beside the data in ``_kolo_metadata.json``, keyed by a fingerprint of
the data files (paths, sizes, modification times/entity tags), so a rewritten dataset is
described afresh.

Example::

    from kolo.data import read_metadata

    meta = read_metadata("s3://bucket/train", storage_options={"aws_region": "us-east-1"})
    print(meta.rows, meta.columns["features"].shape)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from kolo import _native

__all__ = ["ColumnInfo", "ColumnSpec", "DatasetMetadata", "FileInfo", "read_metadata"]


@dataclass(frozen=True)
class ColumnInfo:
    """One column of a dataset: its name, element dtype and per-row shape.

    :func:`read_metadata` and :func:`kolo.data.prepare_data` both describe columns with it.
    ``dtype`` is numpy's name of the element type (``"float32"``, ``"int64"``, ``"bool"``);
    ``shape`` is ``()`` for a scalar and ``(n,)`` for an array column (``(None,)`` for a
    prepared list column whose length varies between rows). Both are ``None`` when the column
    cannot be loaded, and ``problem`` says why. The other fields come from the Parquet
    footers; they are ``None`` where nothing measured them (columns returned by
    ``prepare_data``). ``ColumnSpec`` is another name for this class.

    Example::

        info = read_metadata("/data/train").columns["features"]
        assert (info.name, info.dtype, info.shape) == ("features", "float32", (784,))
    """

    name: str
    dtype: Optional[str]
    shape: Optional[Tuple[Optional[int], ...]]
    #: The Arrow type, as Arrow prints it.
    arrow_type: Optional[str] = None
    #: Uncompressed bytes of the column in all files.
    uncompressed_bytes: Optional[int] = None
    #: Nulls counted; ``None`` when a file has no statistics.
    null_count: Optional[int] = None
    #: Why the column cannot be loaded: ``{"kind": "unsupported" | "ragged" | "nulls", ...}``.
    problem: Optional[Dict[str, Any]] = None


#: The former name of :class:`ColumnInfo` for prepared columns, kept for compatibility.
ColumnSpec = ColumnInfo


@dataclass(frozen=True)
class FileInfo:
    """One data file: path relative to the dataset, size, rows and rows per row group."""

    path: str
    bytes: int
    rows: int
    row_groups: Tuple[int, ...]


@dataclass(frozen=True)
class DatasetMetadata:
    """What a Parquet dataset holds (see :func:`read_metadata`)."""

    url: str
    fingerprint: str
    rows: int
    bytes: int
    files: Tuple[FileInfo, ...]
    columns: Dict[str, ColumnInfo]

    @property
    def row_groups(self) -> int:
        """Number of row groups in all files."""
        return sum(len(f.row_groups) for f in self.files)

    @classmethod
    def _from_json(cls, text: str) -> DatasetMetadata:
        raw = json.loads(text)
        columns = {
            c["name"]: ColumnInfo(
                name=c["name"],
                arrow_type=c["arrow_type"],
                dtype=c["dtype"],
                shape=None if c["shape"] is None else tuple(c["shape"]),
                uncompressed_bytes=c["uncompressed_bytes"],
                null_count=c["null_count"],
                problem=c["problem"],
            )
            for c in raw["columns"]
        }
        files = tuple(
            FileInfo(f["path"], f["bytes"], f["rows"], tuple(f["row_groups"])) for f in raw["files"]
        )
        return cls(raw["url"], raw["fingerprint"], raw["rows"], raw["bytes"], files, columns)


def dataset_location(
    dataset: Union[str, os.PathLike, Any], storage_options: Optional[Mapping[str, str]]
) -> Tuple[str, Optional[Dict[str, str]]]:
    """The URL/path and storage options of ``dataset``: a path, a URL, or a store object
    (``kolo.store.Store``, or anything with ``prefix_path`` and ``storage_options``)."""
    if isinstance(dataset, (str, os.PathLike)):
        location = os.fspath(dataset)
    elif hasattr(dataset, "native_location") and storage_options is None:
        location, native_options = dataset.native_location()
        return str(location), dict(native_options)
    elif hasattr(dataset, "prefix_path"):
        location = str(dataset.prefix_path)
        if storage_options is None:
            storage_options = getattr(dataset, "storage_options", None)
    else:
        raise TypeError(
            f"a dataset or store must be a path, a URL or a kolo.store.Store, not {type(dataset)!r}"
        )
    options = (
        None if storage_options is None else {str(k): str(v) for k, v in storage_options.items()}
    )
    return location, options


def read_metadata(
    path: Union[str, os.PathLike, Any], storage_options: Optional[Mapping[str, str]] = None
) -> DatasetMetadata:
    """Reads (or takes from the cache) the metadata of the Parquet dataset at ``path``: a
    directory/prefix of Parquet files (names starting with ``_`` or ``.`` are skipped) or one
    file, local or in a store (``s3://``, ``gs://``, ``az://``, ``hdfs://``, ``dbfs:/``).

    Raises :class:`~kolo.exceptions.StoreError` when the path cannot be reached and
    :class:`~kolo.exceptions.DataError` when it holds no usable Parquet files.

    Example::

        meta = read_metadata("/data/train")
        print(meta.rows, meta.files[0].path, meta.columns["label"].dtype)
    """
    location, options = dataset_location(path, storage_options)
    return DatasetMetadata._from_json(_native.read_metadata_json(location, options))
