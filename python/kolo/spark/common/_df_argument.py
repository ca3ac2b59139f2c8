"""The DataFrame argument of ``fit``/``transform`` under both spellings: Horovod's ``df``
(``HorovodEstimator.fit(self, df, params=None)``, ``HorovodModel.transform(self, df,
params=None)``) and PySpark's ``dataset`` (``Estimator.fit(dataset, params=None)``)."""

from __future__ import annotations

from typing import Any

from kolo.exceptions import InvalidArgumentError, MissingArgumentError


def dataframe_argument(df: Any, dataset: Any, call: str) -> Any:
    """The one DataFrame given as ``df`` or ``dataset`` to ``call`` (e.g. ``"fit"``)."""
    if df is not None and dataset is not None:
        raise InvalidArgumentError(
            f"{call}() got the DataFrame twice, as df= and as dataset=: pass one of them "
            "(df is Horovod's name, dataset PySpark's)"
        )
    if df is None and dataset is None:
        raise MissingArgumentError(
            f"{call}() needs a DataFrame: {call}(df) (or {call}(dataset=df), PySpark's name)"
        )
    return df if df is not None else dataset
