"""The Spark side of the estimators' ``transform``: one UDF over the feature columns that runs
a framework's batched predictor (``kolo.spark.torch.model._Predictor`` and subclasses).

Only the feature columns travel to Python and only the outputs come back; the other columns
(Spark ML vectors included) stay in the JVM. On Spark >= 4.1 it is an Arrow UDF (no pandas, no
Python object per row), else a pandas UDF.

Example::

    sizes = [None]                      # one scalar output
    payload = cloudpickle.dumps({...})  # what the predictor loads once per Python worker
    df = predict_columns(df, ["features"], ["prediction"], sizes, payload, _Predictor, 1024)
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from kolo.exceptions import DataError, InvalidArgumentError

__all__ = ["predict_columns"]

_FEATURE = "__kolo_feature_{}"
_PACKED = "__kolo_outputs"


def predict_columns(
    df: Any,
    feature_cols: Sequence[str],
    out_cols: Sequence[str],
    sizes: Sequence[Optional[int]],
    payload: bytes,
    predictor_cls: Any,
    batch_size: int,
) -> Any:
    """``df`` with one column per model output (``out_cols``; a size of None is a double
    column, a number an array of doubles), computed by ``predictor_cls(broadcast(payload),
    out_cols, sizes, batch_size)`` over ``feature_cols`` (vectors arrive as float32 arrays).

    Example::

        predict_columns(df, ["x"], ["y"], [None], payload, _Predictor, 1024)
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from kolo.spark.common.util import _is_vector

    fields = {f.name: f.dataType for f in df.schema.fields}
    inputs: List[str] = []
    extra = []
    for i, name in enumerate(feature_cols):
        if name not in fields:
            raise DataError(
                f"the feature column {name!r} is not in the DataFrame; its columns are: "
                f"{', '.join(fields)}"
            )
        if _is_vector(fields[name]):
            tmp = _FEATURE.format(i)
            extra.append(vector_to_array(F.col(name), "float32").alias(tmp))
            inputs.append(tmp)
        else:
            inputs.append(name)
    if len(out_cols) != len(sizes):
        raise InvalidArgumentError(
            f"{len(out_cols)} output columns for {len(sizes)} model outputs: set one "
            "output column per label with setOutputCols"
        )
    out_fields = [
        T.StructField(
            col, T.DoubleType() if size is None else T.ArrayType(T.DoubleType(), False), True
        )
        for col, size in zip(out_cols, sizes)
    ]
    broadcast = df.sparkSession.sparkContext.broadcast(payload)
    predictor = predictor_cls(broadcast, list(out_cols), list(sizes), int(batch_size))
    source = df.select("*", *extra) if extra else df
    arrow_udf = getattr(F, "arrow_udf", None)
    if len(out_fields) == 1:
        if arrow_udf is not None:
            udf = arrow_udf(predictor.arrow_array, out_fields[0].dataType)
        else:
            udf = F.pandas_udf(predictor.series, out_fields[0].dataType)
        result = source.withColumn(out_cols[0], udf(*inputs))
    else:
        if arrow_udf is not None:
            udf = arrow_udf(predictor.arrow_struct, T.StructType(out_fields))
        else:
            udf = F.pandas_udf(predictor.frame, T.StructType(out_fields))
        result = source.withColumn(_PACKED, udf(*inputs)).select(
            "*", *(F.col(f"{_PACKED}.{col}").alias(col) for col in out_cols)
        )
        result = result.drop(_PACKED)
    return result.drop(*[_FEATURE.format(i) for i in range(len(inputs))])
