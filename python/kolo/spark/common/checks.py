"""Checks the estimators run on the driver before and while launching training, for every
framework and launcher (the Spark estimators and :class:`kolo.ray.TorchEstimator`). Importing
this module does not import PySpark.

Example::

    from kolo.spark.common.checks import check_rows_per_rank

    check_rows_per_rank(train_rows=1000, ranks=2, batch_size=32, ranks_param="num_proc")
"""

from __future__ import annotations

from typing import Any

import cloudpickle

__all__ = ["check_rows_per_rank", "check_store_writable", "pickled"]


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
