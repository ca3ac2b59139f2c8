"""Checks the estimators run on the driver before and while launching training, for every
framework and launcher (the Spark estimators and :class:`kolo.ray.TorchEstimator`): typed
:mod:`kolo.exceptions` errors that name what is wrong and how to fix it, raised before any
data is written or any rank starts. Importing this module imports neither PySpark nor a
framework.

Example::

    from kolo.estimator.checks import check_rows_per_rank

    check_rows_per_rank(train_rows=1000, ranks=2, batch_size=32, ranks_param="num_proc")
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import cloudpickle

__all__ = [
    "FIX_FN",
    "FIX_MODEL",
    "check_rows_per_rank",
    "check_shapes",
    "check_store_writable",
    "pickled",
    "training_columns",
]

#: How to make a user function (loss, metric, callback...) picklable, for error messages.
FIX_FN = "define it at module level, or keep locks, open files and sessions out of it"

#: How to make a model picklable, for error messages.
FIX_MODEL = "keep locks, open files, sessions and the like out of the model"


def pickled(what: str, value: Any, fix: str) -> bytes:
    """``cloudpickle.dumps(value)``, or :class:`~kolo.exceptions.InvalidArgumentError` naming
    ``what`` and the ``fix``.

    Example::

        model_bytes = pickled("model", model, "keep locks and open files out of the model")
    """
    from kolo.exceptions import InvalidArgumentError

    try:
        return cloudpickle.dumps(value)
    except Exception as err:
        raise InvalidArgumentError(
            f"the {what} cannot be pickled to send it to the training processes "
            f"({type(err).__name__}: {err}): {fix}"
        ) from err


def check_store_writable(store: Any, writers: str) -> None:
    """Raises :class:`~kolo.exceptions.StoreError` unless this process can write into
    ``store``'s runs folder; ``writers`` names who else must (for the message)."""
    from kolo.exceptions import StoreError

    probe = f"{store.get_runs_path()}/.kolo_write_probe"
    try:
        store.write_bytes(probe, b"kolo")
        store.delete(probe)
    except Exception as err:
        raise StoreError(
            f"the store {store.prefix_path} is not writable ({err}): pick a location {writers} "
            "can write, or fix its permissions or credentials"
        ) from err


def check_rows_per_rank(train_rows: int, ranks: int, batch_size: int, ranks_param: str) -> None:
    """Raises :class:`~kolo.exceptions.DataError` when a rank's share of ``train_rows`` is less
    than one batch (``ranks_param`` names the launcher's rank-count parameter, for the message).

    Example::

        check_rows_per_rank(meta.train_rows, num_proc, batch_size, "num_proc")
    """
    from kolo.exceptions import DataError

    per_rank = train_rows // ranks
    if per_rank < batch_size:
        raise DataError(
            f"{train_rows} training rows give each of the {ranks} ranks {per_rank} rows, fewer "
            f"than batch_size={batch_size}: lower batch_size or {ranks_param}, or add data"
        )


def training_columns(
    feature_cols: Union[str, Sequence[str], None],
    label_cols: Union[str, Sequence[str], None],
    sample_weight_col: Optional[str] = None,
) -> List[str]:
    """The columns training reads, each once: features, labels and the sample weight column;
    :class:`~kolo.exceptions.InvalidArgumentError` when no feature or no label column is set.

    Example::

        assert training_columns(["x"], "y", "w") == ["x", "y", "w"]
    """
    from kolo.exceptions import InvalidArgumentError

    if not feature_cols:
        raise InvalidArgumentError("feature_cols is not set: pass feature_cols=[...]")
    if not label_cols:
        raise InvalidArgumentError("label_cols is not set: pass label_cols=[...]")
    features = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
    labels = [label_cols] if isinstance(label_cols, str) else list(label_cols)
    columns = [*features, *labels]
    if sample_weight_col:
        columns.append(sample_weight_col)
    return list(dict.fromkeys(columns))


def check_shapes(
    shapes: Optional[Sequence[Any]], columns: Sequence[str], shapes_param: str, kind: str
) -> None:
    """Raises :class:`~kolo.exceptions.InvalidArgumentError` unless ``shapes`` (when set)
    gives one shape per column (``shapes_param`` and ``kind`` name them in the message).

    Example::

        check_shapes([[-1, 1]], ["label"], "label_shapes", "label")
    """
    from kolo.exceptions import InvalidArgumentError

    if shapes is not None and len(shapes) != len(columns):
        raise InvalidArgumentError(
            f"{shapes_param} has {len(shapes)} shapes for {len(columns)} {kind} columns: "
            f"give one shape per {kind} column"
        )
