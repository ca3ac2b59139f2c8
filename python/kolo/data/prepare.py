"""Preparation of non-Spark sources (Parquet/CSV files, pyarrow Tables, pandas DataFrames)
into a store, in Horovod's layout, ready for :class:`kolo.data.ParquetLoader` and the
estimators.

Example::

    import pandas as pd
    from kolo.data import prepare_data

    df = pd.DataFrame({"x": [0.0, 1.0, 2.0, 3.0], "y": [0, 1, 0, 1]})
    prepared = prepare_data("/tmp/store", df, feature_columns=["x"], label_columns=["y"],
                            validation=0.25, num_processes=2, partitions_per_process=1)
    print(prepared.train_path, prepared.train_rows, prepared.val_rows)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kolo import _native
from kolo.data.metadata import ColumnInfo, dataset_location
from kolo.exceptions import InvalidArgumentError

__all__ = ["PreparedData", "prepare_data"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


@dataclass(frozen=True)
class PreparedData:
    """What :func:`prepare_data` wrote.

    Example::

        prepared = prepare_data(store, "data.parquet", feature_columns=["x"], label_columns=["y"])
        loader = ParquetLoader(prepared.train_path, ["x", "y"], batch_size=32, rank=0, size=1)
    """

    #: Index of the dataset in the store (``intermediate_train_data.<dataset_idx>``).
    dataset_idx: int
    #: URL of the train directory.
    train_path: str
    #: URL of the validation directory, or ``None`` without a validation split.
    val_path: str | None
    #: Rows written for training.
    train_rows: int
    #: Rows written for validation.
    val_rows: int
    #: The written columns in order: name → :class:`~kolo.data.ColumnInfo` (name, dtype and
    #: shape; the footer fields are ``None``).
    columns: Mapping[str, ColumnInfo]
    #: Train files written (``num_processes * partitions_per_process`` unless fewer rows).
    num_files: int
    #: Validation files written.
    val_num_files: int


def prepare_data(
    store: Any,
    source: Any,
    *,
    feature_columns: str | Sequence[str],
    label_columns: str | Sequence[str],
    validation: float | str | None = None,
    sample_weight_col: str | None = None,
    num_processes: int = 1,
    partitions_per_process: int = 10,
    dataset_idx: int | None = None,
    seed: int = 0,
    storage_options: Mapping[str, str] | None = None,
    compression: str = "snappy",
    overwrite: bool = True,
) -> PreparedData:
    """Write ``source`` into ``store`` as Horovod's prepared train (and validation) data.

    The feature, label and sample-weight columns are selected (in that order) and checked:
    each must be numeric or bool, or (features and labels) a list of numbers or bools, without
    nulls (the same rules :class:`~kolo.data.ParquetLoader` loads by).
    The rows are split into validation and train, and each side is written as Parquet under
    ``<prefix>/intermediate_train_data.<idx>/`` and ``<prefix>/intermediate_val_data.<idx>/``:
    exactly ``num_processes * partitions_per_process`` train files (fewer only when there are
    fewer rows) whose row counts differ by at most one, named ``part-00000.parquet`` on, with
    a ``_SUCCESS`` marker written last. The work runs in Rust (DataFusion) with the GIL
    released; Ctrl-C stops it.

    Args:
        store: A :class:`kolo.store.Store`, or a store prefix (local path, ``file://``,
            ``s3://``, ``gs://``, ``az://``, ``hdfs://``, ``dbfs:/``).
        source: A Parquet or CSV path (or URL), a directory of Parquet files, a list of such
            paths (one format), a ``pyarrow.Table`` / ``RecordBatchReader`` (anything with
            ``__arrow_c_stream__``), or a pandas DataFrame (its index is dropped). Remote
            paths are reached with ``storage_options`` (or the store's).
        feature_columns: Model input column(s).
        label_columns: Target column(s).
        validation: A ratio in ``[0, 1)`` of rows for validation (chosen from ``seed`` and
            each row's position, so the same inputs give the same split), or the name of a
            bool/numeric column whose true (non-zero) rows are validation rows (the column is
            not written). ``None`` or ``0`` writes no validation set.
        sample_weight_col: Per-row sample weight column.
        num_processes: Training processes that will read the data.
        partitions_per_process: Files per process.
        dataset_idx: Index of the dataset in the store; ``None`` takes the next free one.
        seed: Seed of the validation ratio split.
        storage_options: Credentials/endpoints (object_store keys such as
            ``aws_access_key_id``, ``aws_endpoint``) for a prefix string and the source
            paths; defaults to the store's.
        compression: Parquet codec: ``snappy``, ``zstd``, ``lz4``, ``gzip``, ``brotli`` or
            ``none``.
        overwrite: Replace an existing dataset at ``dataset_idx``; with ``False`` an existing
            one raises :class:`kolo.exceptions.DataError`.

    Returns:
        A :class:`PreparedData` describing what was written; its ``columns`` are
        :class:`~kolo.data.ColumnInfo` objects.

    Raises:
        kolo.exceptions.DataError: A column is missing (the message lists the available
            ones), has an unusable type or nulls (the message names it), the source or a
            split side is empty, or the output exists and ``overwrite`` is ``False``.
        kolo.exceptions.InvalidArgumentError: A ratio outside ``[0, 1)``, no feature or label
            columns, a count below 1, an unknown codec.
        kolo.exceptions.StoreError: A source path does not exist or a store cannot be read or
            written (wrong credentials, unreachable endpoint).
        TypeError: ``source`` or ``store`` is of a kind this function does not take.

    Example::

        from kolo.data import prepare_data

        prepared = prepare_data(
            "s3://bucket/kolo", "s3://bucket/raw/train.parquet",
            feature_columns=["features"], label_columns=["label"], validation=0.1,
            num_processes=4, storage_options={"aws_region": "us-east-1"},
        )
        print(prepared.num_files, prepared.columns["features"].shape)
    """
    prefix, options = dataset_location(store, storage_options)
    prefix = _local_or_url(prefix)
    request = {
        "feature_columns": _names("feature_columns", feature_columns),
        "label_columns": _names("label_columns", label_columns),
        "sample_weight_col": sample_weight_col,
        "validation_ratio": None,
        "validation_column": None,
        "num_processes": _count("num_processes", num_processes),
        "partitions_per_process": _count("partitions_per_process", partitions_per_process),
        "dataset_idx": None if dataset_idx is None else _count("dataset_idx", dataset_idx, 0),
        "seed": int(seed) & 0xFFFF_FFFF_FFFF_FFFF,
        "compression": str(compression),
        "overwrite": bool(overwrite),
    }
    if isinstance(validation, str):
        request["validation_column"] = validation
    elif validation is not None:
        if isinstance(validation, bool) or not isinstance(validation, (int, float)):
            raise InvalidArgumentError(
                f"validation must be a ratio in [0, 1), a column name or None, not {validation!r}"
            )
        request["validation_ratio"] = float(validation)

    paths, stream = _source(source)
    result = _native.prepare_data(
        prefix, options, request, source_paths=paths, source_stream=stream
    )
    return PreparedData(
        dataset_idx=result["dataset_idx"],
        train_path=result["train_path"],
        val_path=result["val_path"],
        train_rows=result["train_rows"],
        val_rows=result["val_rows"],
        columns={
            name: ColumnInfo(name, dtype, tuple(shape)) for name, dtype, shape in result["columns"]
        },
        num_files=result["num_files"],
        val_num_files=result["val_num_files"],
    )


def _local_or_url(path: str) -> str:
    """An absolute local path, or the URL unchanged."""
    return path if _URL.match(path) else os.path.abspath(os.path.expanduser(path))


def _source(source: Any) -> tuple[list[str] | None, Any]:
    """Paths, or the Arrow C stream capsule, of a supported source."""
    if isinstance(source, (str, os.PathLike)):
        return [_local_or_url(os.fspath(source))], None
    if isinstance(source, (list, tuple)):
        if not source or not all(isinstance(p, (str, os.PathLike)) for p in source):
            raise TypeError("a list source must be a non-empty list of paths/URLs")
        return [_local_or_url(os.fspath(p)) for p in source], None
    if type(source).__module__.startswith("pandas") and hasattr(source, "columns"):
        try:
            import pyarrow as pa
        except ImportError as err:  # pragma: no cover - pyarrow is a test dependency
            raise ImportError("preparing a pandas DataFrame needs pyarrow installed") from err
        source = pa.Table.from_pandas(source, preserve_index=False)
    if hasattr(source, "__arrow_c_stream__"):
        return None, source.__arrow_c_stream__()
    raise TypeError(
        f"cannot prepare a {type(source).__name__}; pass a Parquet/CSV path or a list of them, "
        "a pyarrow Table or RecordBatchReader, or a pandas DataFrame"
    )


def _names(argument: str, columns: str | Sequence[str]) -> list[str]:
    """Column names as a list (a single name is allowed)."""
    if isinstance(columns, str):
        return [columns]
    names = list(columns)
    if not all(isinstance(c, str) for c in names):
        raise InvalidArgumentError(f"{argument} must be column names (strings), got {names!r}")
    return names


def _count(argument: str, value: int, minimum: int = 1) -> int:
    """An integer argument that must be at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(f"{argument} must be an integer >= {minimum}, got {value!r}")
    return value
