"""Preparation of a Spark DataFrame for training: Horovod's ``util.prepare_data``.

Spark writes the selected columns as Parquet into the store (``intermediate_train_data.<idx>``
and ``intermediate_val_data.<idx>``); the metadata (rows, dtypes, array lengths) is then read
from the Parquet footers by kolo's Rust core (:func:`kolo.data.read_metadata`). Preparing the
same DataFrame again (same logical plan, columns, validation and store) reuses what was
written. The description of prepared data (:class:`PreparedDataset`,
:func:`get_dataset_metadata`, :func:`describe_dataset`) is the estimator core's
(:mod:`kolo.estimator.dataset`), offered here under Horovod's module path too.

Example::

    from kolo.spark.common.util import get_dataset_metadata, prepare_data

    with prepare_data(2, store, df, label_columns=["label"], feature_columns=["features"],
                      validation=0.1) as dataset_idx:
        meta = get_dataset_metadata(store, dataset_idx)
        print(meta.train_rows, meta.columns["features"].shape)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from kolo.data import read_metadata
from kolo.estimator.dataset import PreparedDataset, describe_dataset, get_dataset_metadata
from kolo.exceptions import DataError, InvalidArgumentError

__all__ = [
    "PreparedDataset",
    "describe_dataset",
    "get_dataset_metadata",
    "prepare_data",
    "spark_path",
]

log = logging.getLogger(__name__)

#: What prepare_data wrote in this process: cache key → dataset index.
_PREPARED: Dict[str, int] = {}
_LOCK = threading.Lock()


def spark_path(path: str) -> str:
    """The form of a store path that Spark's Hadoop filesystems read and write
    (``s3://`` → ``s3a://``; every other form is passed on).

    Example::

        assert spark_path("s3://bucket/x") == "s3a://bucket/x"
    """
    if path.startswith("s3://"):
        return "s3a://" + path[len("s3://") :]
    return path


def _is_vector(data_type: Any) -> bool:
    from pyspark.ml.linalg import VectorUDT as MLVector

    try:
        from pyspark.mllib.linalg import VectorUDT as MLlibVector
    except ImportError:  # pragma: no cover - mllib is part of pyspark
        MLlibVector = MLVector
    return isinstance(data_type, (MLVector, MLlibVector))


def _check_type(role: str, name: str, data_type: Any, scalar_only: bool = False) -> None:
    from pyspark.sql import types as T

    numeric = (T.NumericType, T.BooleanType)
    if isinstance(data_type, numeric):
        return
    if not scalar_only:
        if _is_vector(data_type):
            return
        if isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType, numeric):
            return
    what = (
        "a number or bool" if scalar_only else "a number, a bool, an array of numbers or a Vector"
    )
    fix = (
        "index it first (pyspark.ml.feature.StringIndexer) or drop it from the columns"
        if isinstance(data_type, (T.StringType, T.BinaryType))
        else "convert it to numbers"
    )
    raise DataError(
        f"the {role} column {name!r} has type {data_type.simpleString()}; it must be {what}: {fix}"
    )


def _validate(
    df: Any,
    label_columns: Sequence[str],
    feature_columns: Sequence[str],
    validation: Any,
    sample_weight_col: Optional[str],
) -> None:
    if not feature_columns:
        raise InvalidArgumentError("feature_columns is empty: name at least one feature column")
    if not label_columns:
        raise InvalidArgumentError("label_columns is empty: name at least one label column")
    fields = {f.name: f.dataType for f in df.schema.fields}
    available = ", ".join(fields)
    roles = [("feature", c) for c in feature_columns] + [("label", c) for c in label_columns]
    if sample_weight_col:
        roles.append(("sample weight", sample_weight_col))
    if isinstance(validation, str):
        roles.append(("validation", validation))
    for role, name in roles:
        if name not in fields:
            raise DataError(
                f"the {role} column {name!r} is not in the DataFrame; its columns are: {available}"
            )
        _check_type(role, name, fields[name], scalar_only=role in ("sample weight", "validation"))
    if validation is not None and not isinstance(validation, str):
        if isinstance(validation, bool) or not isinstance(validation, (int, float)):
            raise InvalidArgumentError(
                f"validation={validation!r} must be a ratio in [0, 1) or a column name"
            )
        if not 0 <= float(validation) < 1:
            raise InvalidArgumentError(
                f"validation={validation!r} must be a ratio in [0, 1) (e.g. 0.1) or a column name"
            )


def _select(df: Any, columns: List[str]) -> Any:
    """Selects ``columns`` once each, vectors converted to ``array<float>``."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    fields = {f.name: f.dataType for f in df.schema.fields}
    exprs = []
    for name in columns:
        if _is_vector(fields[name]):
            exprs.append(vector_to_array(F.col(name), "float32").alias(name))
        else:
            exprs.append(F.col(name))
    return df.select(*exprs)


def _cache_key(
    df: Any,
    store: Any,
    columns: List[str],
    validation: Any,
    num_files: int,
    seed: Optional[int],
) -> str:
    """The logical plan's semantic hash (expression ids canonicalized) plus everything else
    that shapes the written data."""
    try:
        plan = str(df.semanticHash())
    except Exception:  # pragma: no cover - Spark Connect dataframes
        plan = str(df._jdf.queryExecution().analyzed().toString())
    text = repr((plan, df.schema.json(), store.prefix_path, columns, validation, num_files, seed))
    return hashlib.sha256(text.encode()).hexdigest()


def _next_index(store: Any) -> int:
    idx = 0
    while store.exists(store.get_train_data_path(idx)) or store.exists(
        store.get_val_data_path(idx)
    ):
        idx += 1
    return idx


def _complete(store: Any, idx: int, with_val: bool) -> bool:
    train = store.get_train_data_path(idx)
    if not store.exists(f"{train}/_SUCCESS"):
        return False
    return not with_val or store.exists(f"{store.get_val_data_path(idx)}/_SUCCESS")


def _write(df: Any, path: str) -> None:
    (
        df.write.mode("overwrite")
        .option("parquet.enable.dictionary", "false")
        .parquet(spark_path(path))
    )


@contextlib.contextmanager
def prepare_data(
    num_processes: int,
    store: Any,
    df: Any,
    label_columns: Sequence[str],
    feature_columns: Sequence[str],
    validation: Optional[Union[float, str]] = None,
    sample_weight_col: Optional[str] = None,
    compress_sparse: bool = False,
    partitions_per_process: int = 10,
    verbose: int = 0,
    random_seed: Optional[int] = None,
) -> Iterator[int]:
    """Writes ``df``'s features, labels and sample weights as Parquet into ``store`` and
    yields the dataset index (Horovod's context manager).

    - Spark ML vectors (dense and sparse) become ``array<float>`` columns (sparse ones are
      written dense; ``compress_sparse`` is accepted for Horovod compatibility).
    - ``validation``: a ratio (rows split with ``randomSplit`` seeded by ``random_seed``, 0 when
      None) or a bool/int column (true/non-zero rows are validation rows).
    - ``num_processes * partitions_per_process`` training files, Horovod's
      ``max(int(files * ratio), num_processes)`` validation files, written without
      dictionary encoding so kolo's loader reads the pages without decoding.
    - The same DataFrame (by its logical plan's semantic hash), columns, validation and store
      reuse the dataset written before in this process, if it is still complete.
    - Raises :class:`~kolo.exceptions.DataError` for a missing column, a string or other
      unusable column, an empty DataFrame, or vectors of different lengths, and
      :class:`~kolo.exceptions.InvalidArgumentError` for bad arguments.

    Example::

        with prepare_data(2, store, df, ["label"], ["features"], validation=0.2) as idx:
            print(store.get_train_data_path(idx))
    """
    label_columns = [label_columns] if isinstance(label_columns, str) else list(label_columns)
    feature_columns = (
        [feature_columns] if isinstance(feature_columns, str) else list(feature_columns)
    )
    if int(num_processes) < 1 or int(partitions_per_process) < 1:
        raise InvalidArgumentError(
            f"num_processes={num_processes} and partitions_per_process="
            f"{partitions_per_process} must both be at least 1"
        )
    _validate(df, label_columns, feature_columns, validation, sample_weight_col)
    columns: List[str] = []
    for name in [*feature_columns, *label_columns, sample_weight_col]:
        if name and name not in columns:
            columns.append(name)
    num_files = int(num_processes) * int(partitions_per_process)
    seed = 0 if random_seed is None else int(random_seed)
    with_val = bool(validation)
    key = _cache_key(df, store, columns, validation, num_files, seed)
    with _LOCK:
        idx = _PREPARED.get(key)
        if idx is not None and _complete(store, idx, with_val):
            log.info("reusing prepared dataset %d in %s", idx, store.prefix_path)
        else:
            idx = _prepare(
                df, store, columns, validation, num_files, num_processes, seed, with_val, verbose
            )
            _PREPARED[key] = idx
    get_dataset_metadata(store, idx, columns)
    yield idx


def _prepare(
    df: Any,
    store: Any,
    columns: List[str],
    validation: Any,
    num_files: int,
    num_processes: int,
    seed: int,
    with_val: bool,
    verbose: int,
) -> int:
    from pyspark.sql import functions as F

    idx = _next_index(store)
    train_path = store.get_train_data_path(idx)
    val_path = store.get_val_data_path(idx)
    if isinstance(validation, str):
        flag = F.col(validation).cast("boolean")
        train_df = _select(df.filter(~flag), columns)
        val_df = _select(df.filter(flag), columns)
        ratio = 0.2
    elif with_val:
        ratio = float(validation)
        selected = _select(df, columns)
        train_df, val_df = selected.randomSplit([1.0 - ratio, ratio], seed=seed)
    else:
        train_df, val_df, ratio = _select(df, columns), None, 0.0
    log.info("preparing dataset %d: writing %s", idx, train_path)
    if val_df is not None:
        val_files = max(int(num_files * ratio), int(num_processes))
        _write(val_df.repartition(val_files), val_path)
    _write(train_df.repartition(num_files), train_path)
    if verbose:
        log.info("prepared dataset %d in %s", idx, store.prefix_path)
    options = store.native_location()[1]
    train_rows = _rows(train_path, options)
    val_rows = _rows(val_path, options) if val_df is not None else 0
    if train_rows == 0:
        store.delete(train_path)
        store.delete(val_path)
        if val_rows == 0:
            raise DataError(
                "the DataFrame has no rows: check the filters and the source before fitting"
            )
        raise DataError(
            f"no training rows are left after the validation split ({validation!r}): use a "
            "smaller ratio or mark fewer rows as validation"
        )
    if val_df is not None and val_rows == 0:
        log.warning("the validation split of dataset %d is empty; training without it", idx)
        store.delete(val_path)
    return idx


def _rows(path: str, options: Any) -> int:
    """Rows of a dataset Spark wrote (an empty DataFrame gives one file of 0 rows)."""
    return read_metadata(path, options).rows
