"""The Spark side of the estimators' ``transform``: one UDF over the feature columns
(:func:`predict_columns`) that runs a framework's batched :class:`Predictor`.

Only the feature columns travel to Python and only the outputs come back; the other columns
(Spark ML vectors included) stay in the JVM. On Spark >= 4.1 it is an Arrow UDF (no pandas, no
Python object per row), else a pandas UDF. On a classic session the model travels once as a
broadcast; on a Spark Connect session (no ``SparkContext``, so no broadcast) it travels inside
the UDF's pickled closure, which the Connect server ships to its tasks as Spark ships any UDF.
Either way it is loaded once per Python worker; each batch is predicted in chunks of
``batch_size`` rows. A framework subclasses :class:`Predictor` with how to load its model and
run it on a chunk.

Example::

    sizes = [None]                      # one scalar output
    payload = cloudpickle.dumps({...})  # what the predictor loads once per Python worker
    df = predict_columns(df, ["features"], ["prediction"], sizes, payload, TorchPredictor, 1024)
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pandas as pd
import pyarrow as pa

from kolo.exceptions import DataError, InvalidArgumentError

__all__ = ["InlinePayload", "Predictor", "predict_columns"]

#: The model loaded in this Python worker, per predictor class: (payload key, model).
_LOADED: Dict[type, Tuple[str, Any]] = {}
_LOADED_LOCK = threading.Lock()

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
    column, a number an array of doubles), computed by ``predictor_cls(shipped(payload),
    out_cols, sizes, batch_size)`` over ``feature_cols`` (vectors arrive as float32 arrays);
    ``shipped`` is a broadcast on a classic session and :class:`InlinePayload` on Spark Connect.

    Example::

        predict_columns(df, ["x"], ["y"], [None], payload, TorchPredictor, 1024)
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
    predictor = predictor_cls(_ship(df, payload), list(out_cols), list(sizes), int(batch_size))
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


class InlinePayload:
    """The model payload carried inside the UDF's closure (Spark Connect, where there is no
    broadcast): it has a broadcast's ``value``, so a :class:`Predictor` reads both alike.

    Example::

        InlinePayload(b"...").value   # b"..."
    """

    def __init__(self, value: bytes) -> None:
        self.value = value


#: The Spark Connect server's default ``spark.connect.grpc.maxInboundMessageSize`` (128 MiB).
CONNECT_MAX_MESSAGE_DEFAULT = 128 << 20
#: Room a transform's plan needs besides the model payload inlined in its UDF.
CONNECT_PLAN_SLACK = 1 << 20


def _ship(df: Any, payload: bytes) -> Any:
    """How the payload reaches the Python workers: a broadcast on a classic session (sent once
    per executor), inline in the closure on Spark Connect. (Only the session's type is asked:
    transform needs neither barrier stages nor tags, so it works on any Connect client.)"""
    from kolo.spark._session import _connect_session_type

    session = df.sparkSession
    connect_type = _connect_session_type()
    if connect_type is not None and isinstance(session, connect_type):
        _check_fits_a_connect_message(session, len(payload))
        return InlinePayload(payload)
    return session.sparkContext.broadcast(payload)


def _check_fits_a_connect_message(session: Any, size: int) -> None:
    """``ConfigError`` at the call when the model inlined in the UDF would make the plan larger
    than the Connect server accepts (it would otherwise fail inside the server's gRPC layer)."""
    from kolo.exceptions import ConfigError

    key = "spark.connect.grpc.maxInboundMessageSize"
    try:
        limit = int(session.conf.get(key, None) or CONNECT_MAX_MESSAGE_DEFAULT)
    except (TypeError, ValueError):
        limit = CONNECT_MAX_MESSAGE_DEFAULT
    if size + CONNECT_PLAN_SLACK > limit:
        raise ConfigError(
            f"transform on Spark Connect: the model is {size / 2**20:.1f} MiB, and on Connect it "
            f"travels inside the transform's plan, which the server accepts up to "
            f"{limit / 2**20:.1f} MiB ({key}). Raise {key} on the Connect server (a server "
            "setting, e.g. --conf at its start) above the model's size plus 1 MiB, or transform "
            "on a classic SparkSession (its model goes out as a broadcast, without that limit)."
        )


def _stacked(values: Any) -> Any:
    """An object array of equal-length 1-D arrays (pandas' form of an Arrow list column) as
    one [rows, len] array. Arrow converts a list column into views of one flat buffer, so
    when the rows lie back to back there, that buffer is used as it is; else they are
    copied."""
    import numpy as np

    if not len(values):
        return np.zeros((0, 0), dtype=np.float32)
    lengths = {len(v) for v in values}
    if len(lengths) > 1:
        raise DataError(
            "a feature column holds arrays of different lengths; give every row a vector of "
            "the same length"
        )
    first, last = values[0], values[-1]
    width = len(first)
    base = first.base
    if (
        isinstance(first, np.ndarray)
        and isinstance(last, np.ndarray)
        and base is not None
        and last.base is base
        and isinstance(base, np.ndarray)
        and base.flags.c_contiguous
        and first.dtype == base.dtype == last.dtype
        and first.flags.c_contiguous
        and width > 0
    ):
        item = base.itemsize
        start, remainder = divmod(first.ctypes.data - base.ctypes.data, item)
        end = start + len(values) * width
        # Arrow list offsets only grow, so with every row `width` long and the last row
        # `(rows - 1) * width` after the first, each row lies right after the one before.
        if (
            not remainder
            and start >= 0
            and end <= base.size
            and last.ctypes.data == base.ctypes.data + (end - width) * item
            and all(v.base is base for v in values)
        ):
            return base.reshape(-1)[start:end].reshape(len(values), width)
    return np.stack(values)


class Predictor(ABC):
    """The UDF body: feature columns in (one Arrow or pandas batch), model outputs out.

    A subclass says how to load its framework's model from the shipped payload
    (:meth:`_load_model`, once per Python worker and payload), how to turn the batch's numpy
    columns into model inputs (:meth:`_inputs`) and how to run the model on a chunk of them
    (:meth:`_outputs`: one ``[rows, values]`` float64 array per output).

    Example::

        predictor = TorchPredictor(broadcast, ["pred"], [None], 1024)
        predictor.arrow_array(features)      # a double array, one value per row
    """

    def __init__(
        self, broadcast: Any, out_cols: List[str], sizes: List[Optional[int]], batch_size: int
    ) -> None:
        self.broadcast = broadcast
        self.key = uuid.uuid4().hex
        self.out_cols = out_cols
        self.sizes = sizes
        self.batch_size = max(1, batch_size)

    # -- the framework's part ----------------------------------------------------------------

    @abstractmethod
    def _load_model(self, payload: bytes) -> Any:
        """The loaded model (and whatever running it needs) from the shipped payload."""

    def _inputs(self, loaded: Any, columns: List[Any]) -> List[Any]:
        """The batch's feature columns (numpy) as the framework's inputs (sliceable by row)."""
        return columns

    @abstractmethod
    def _outputs(self, loaded: Any, inputs: List[Any]) -> List[Any]:
        """The model's outputs on a chunk of inputs, each as a ``[rows, values]`` float64
        numpy array."""

    # -- shared --------------------------------------------------------------------------------

    def _load(self) -> Any:
        with _LOADED_LOCK:
            key, loaded = _LOADED.get(type(self), (None, None))
            if key != self.key:
                loaded = self._load_model(self.broadcast.value)
                _LOADED[type(self)] = (self.key, loaded)
            return loaded

    def _predict(self, columns: List[Any]) -> List[Any]:
        """The outputs for one batch of feature columns (numpy): per output, [rows] doubles
        or [rows, size] doubles."""
        import numpy as np

        loaded = self._load()
        inputs = self._inputs(loaded, columns)
        rows = len(columns[0])
        chunks: List[List[Any]] = [[] for _ in self.out_cols]
        for start in range(0, rows, self.batch_size):
            chunk = [x[start : start + self.batch_size] for x in inputs]
            for i, out in enumerate(self._outputs(loaded, chunk)):
                chunks[i].append(out)
        results = []
        for parts, size in zip(chunks, self.sizes):
            values = np.concatenate(parts) if parts else np.zeros((0, size or 1))
            results.append(values[:, 0] if size is None else values)
        return results

    @staticmethod
    def _column(series: Any) -> Any:
        """One feature column of the batch as a C-contiguous numpy array ([rows] or
        [rows, len] for array columns), float64 narrowed to float32."""
        import numpy as np

        if series.isnull().any():
            raise DataError("a feature column holds nulls; fill or drop them before transform")
        values = series.to_numpy()
        if values.dtype == object:
            values = _stacked(values)
        if values.dtype == np.float64:
            values = values.astype(np.float32)
        return np.ascontiguousarray(values)

    @staticmethod
    def _arrow_column(array: pa.Array) -> Any:
        """One feature column (an Arrow array) as numpy, like :meth:`_column`."""
        import numpy as np
        import pyarrow.compute as pc

        if array.null_count:
            raise DataError("a feature column holds nulls; fill or drop them before transform")
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            rows = len(array)
            lengths = pc.list_value_length(array)
            low, high = (pc.min(lengths).as_py(), pc.max(lengths).as_py()) if rows else (0, 0)
            if low != high:
                raise DataError(
                    "a feature column holds arrays of different lengths; give every row a "
                    "vector of the same length"
                )
            values = array.flatten().to_numpy(zero_copy_only=False).reshape(rows, high or 0)
        elif pa.types.is_fixed_size_list(array.type):
            values = array.flatten().to_numpy(zero_copy_only=False)
            values = values.reshape(len(array), array.type.list_size)
        else:
            values = array.to_numpy(zero_copy_only=False)
        if values.dtype == np.float64:
            values = values.astype(np.float32)
        return np.ascontiguousarray(values)

    @staticmethod
    def _to_arrow(values: Any) -> pa.Array:
        """[rows] → a double array; [rows, size] → a list<double> array."""
        import numpy as np

        if values.ndim == 1:
            return pa.array(values, type=pa.float64())
        rows, size = values.shape
        offsets = pa.array(np.arange(0, rows * size + 1, size, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))

    def arrow_array(self, *arrays: pa.Array) -> pa.Array:
        """The Arrow UDF for one output column."""
        return self._to_arrow(self._predict([self._arrow_column(a) for a in arrays])[0])

    def arrow_struct(self, *arrays: pa.Array) -> pa.Array:
        """The Arrow UDF for several output columns (a struct of them)."""
        outputs = self._predict([self._arrow_column(a) for a in arrays])
        return pa.StructArray.from_arrays(
            [self._to_arrow(values) for values in outputs], names=self.out_cols
        )

    @staticmethod
    def _as_series(values: Any) -> pd.Series:
        """[rows] → a double Series; [rows, size] → a Series of [size] arrays."""
        return pd.Series(values if values.ndim == 1 else list(values))

    def series(self, *series: pd.Series) -> pd.Series:
        """The UDF for one output column."""
        return self._as_series(self._predict([self._column(c) for c in series])[0])

    def frame(self, *series: pd.Series) -> pd.DataFrame:
        """The UDF for several output columns (a struct of them)."""
        outputs = self._predict([self._column(c) for c in series])
        return pd.DataFrame(
            {col: self._as_series(values) for col, values in zip(self.out_cols, outputs)}
        )
