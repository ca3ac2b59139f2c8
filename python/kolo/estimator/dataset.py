"""Prepared training data as the estimators see it: :class:`PreparedDataset`, described from
the Parquet footers by kolo's Rust core (:func:`kolo.data.read_metadata`), for a dataset
prepared in a store (:func:`get_dataset_metadata`, by index) or any Parquet path
(:func:`describe_dataset`), with the checks that make a bad column a
:class:`~kolo.exceptions.DataError` on the driver. Importing this module imports neither
PySpark nor a framework.

Example::

    from kolo.estimator.dataset import get_dataset_metadata

    meta = get_dataset_metadata(store, 0, ["features", "label"])
    print(meta.train_rows, meta.columns["features"].shape)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from kolo.data import ColumnInfo, read_metadata
from kolo.exceptions import DataError

__all__ = ["PreparedDataset", "describe_dataset", "get_dataset_metadata"]


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared dataset in a store, described from its Parquet footers.

    Example::

        meta = get_dataset_metadata(store, 0)
        meta.train_rows, meta.val_rows, meta.columns["label"].dtype
    """

    dataset_idx: int
    train_path: str
    val_path: Optional[str]
    train_rows: int
    val_rows: int
    #: Column name → :class:`kolo.data.ColumnInfo` (dtype, shape) of the training data.
    columns: Dict[str, ColumnInfo]
    #: Mean bytes per row (uncompressed), Horovod's ``avg_row_size``.
    avg_row_size: float

    @property
    def usable_val_path(self) -> Optional[str]:
        """:attr:`val_path` when the validation data has rows, else ``None``."""
        return self.val_path if self.val_rows > 0 else None

    def metadata(self) -> Dict[str, Any]:
        """What a trained model keeps of its data: ``{"columns": {name: {"dtype", "shape"}},
        "train_rows", "val_rows", "dataset_idx"}``.

        Example::

            meta.metadata()["columns"]["features"]   # {"dtype": "float32", "shape": [64]}
        """
        return {
            "columns": {
                name: {"dtype": info.dtype, "shape": info.shape}
                for name, info in self.columns.items()
            },
            "train_rows": self.train_rows,
            "val_rows": self.val_rows,
            "dataset_idx": self.dataset_idx,
        }


def get_dataset_metadata(
    store: Any, dataset_idx: int, columns: Optional[Sequence[str]] = None
) -> PreparedDataset:
    """Describes the prepared dataset ``dataset_idx`` of ``store`` from its Parquet footers
    (cached beside the data by :func:`kolo.data.read_metadata`).

    Raises :class:`~kolo.exceptions.DataError` when the data is missing, its preparation did
    not finish (no ``_SUCCESS`` marker), it is empty, or a column in ``columns`` cannot be
    loaded (arrays of different lengths, nulls, unsupported type).

    Example::

        meta = get_dataset_metadata(store, 0, ["features", "label"])
        print(meta.train_rows, meta.columns["features"].shape)   # 1000 (64,)
    """
    train_path = store.get_train_data_path(dataset_idx)
    if not store.exists(train_path):
        raise DataError(
            f"no prepared training data at {train_path}: prepare it with fit(df) or "
            "kolo.spark.common.util.prepare_data, or pass the right dataset_idx"
        )
    _check_finished(store, train_path)
    options = store.native_location()[1] if hasattr(store, "native_location") else None
    val_path = store.get_val_data_path(dataset_idx)
    if not (store.exists(val_path) and store.is_parquet_dataset(val_path)):
        val_path = None
    if val_path is not None:
        _check_finished(store, val_path)
    return describe_dataset(train_path, val_path, options, columns, dataset_idx)


#: What a finished preparation writes last into each dataset directory (kolo's and Spark's).
SUCCESS_MARKER = "_SUCCESS"


def _check_finished(store: Any, path: str) -> None:
    """A :class:`~kolo.exceptions.DataError` unless the preparation that wrote ``path``
    finished: its ``_SUCCESS`` marker is written last, so without it the data may be partial
    (a killed or failed preparation)."""
    if not store.exists(f"{path.rstrip('/')}/{SUCCESS_MARKER}"):
        raise DataError(
            f"the prepared data at {path} has no {SUCCESS_MARKER} marker: the preparation that "
            "wrote it did not finish, so it may hold only part of the rows; re-run the "
            "preparation (fit(df), or prepare_data with overwrite=True) to write it again"
        )


def describe_dataset(
    train_path: str,
    val_path: Optional[str],
    options: Optional[Dict[str, str]] = None,
    columns: Optional[Sequence[str]] = None,
    dataset_idx: int = -1,
) -> PreparedDataset:
    """Describes Parquet training (and validation) data at any path from its footers, with
    the checks of :func:`get_dataset_metadata` (``dataset_idx`` -1: not a store dataset).

    Example::

        meta = describe_dataset("/data/train", None, columns=["features", "label"])
    """
    train = read_metadata(train_path, options)
    val_rows = 0
    if val_path is not None:
        val_rows = read_metadata(val_path, options).rows
    if train.rows == 0:
        raise DataError(f"the prepared training data at {train_path} has no rows")
    for name in columns or []:
        info = train.columns.get(name)
        if info is None:
            raise DataError(
                f"column {name!r} is not in the prepared data at {train_path}; it has: "
                f"{', '.join(train.columns)}"
            )
        if info.problem is not None:
            kind = info.problem.get("kind")
            if kind == "ragged":
                detail = "its arrays (vectors) have different lengths"
            elif kind == "nulls":
                detail = "it holds nulls"
            else:
                detail = f"its type {info.arrow_type} cannot be loaded"
            raise DataError(
                f"column {name!r} of {train_path} cannot be used for training: {detail} "
                f"({info.problem}); give every row a value of the same length"
            )
    total = sum(c.uncompressed_bytes or 0 for c in train.columns.values())
    return PreparedDataset(
        dataset_idx=dataset_idx,
        train_path=train_path,
        val_path=val_path,
        train_rows=train.rows,
        val_rows=val_rows,
        columns=dict(train.columns),
        avg_row_size=total / max(train.rows, 1),
    )
