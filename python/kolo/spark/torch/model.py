"""``TorchModel``: the Spark ML Transformer a :class:`~kolo.spark.torch.TorchEstimator`
returns (Horovod's ``horovod.spark.torch.TorchModel``), with batched Arrow inference.

``transform(df)`` keeps every input column and adds one output column per label
(``<label>__output`` unless :meth:`TorchModel.setOutputCols` says otherwise): a double for a
model output of one value per row, ``array<double>`` otherwise. Inference runs in a scalar
pandas UDF over the feature columns only (the other columns stay in the JVM): the model
travels once as a broadcast and is loaded once per Python worker, and each Arrow batch is
predicted in chunks of ``inference_batch_size`` rows (on the task's GPU when ``use_gpu`` and
Spark assigned one).

Example::

    predictions = torch_model.setOutputCols(["pred"]).transform(test_df)
    predictions.select("label", "pred").show()
"""

from __future__ import annotations

import logging
import threading
import uuid
import warnings
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle
import pandas as pd
import pyarrow as pa
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from kolo.exceptions import DataError, InvalidArgumentError
from kolo.spark.common.inference import predict_columns
from kolo.spark.common.params import ModelParams, model_defaults
from kolo.spark.common.serialization import KoloReader, KoloWriter
from kolo.spark.common.training_params import reject_unknown

__all__ = ["TorchModel"]

log = logging.getLogger(__name__)

#: The model loaded in this Python worker: (broadcast id, model, device).
_LOADED: Dict[str, Any] = {}
_LOADED_LOCK = threading.Lock()


def _numpy_dtype(name: Optional[str]) -> Any:
    import numpy as np

    return np.dtype(name or "float32")


class TorchModel(Model, ModelParams, MLReadable, MLWritable):
    """A trained PyTorch model as a Spark ML Transformer.

    Parameters (each with ``getX``/``setX``): ``model``, ``history``, ``feature_columns``,
    ``label_columns``, ``output_cols``, ``run_id``, ``metadata``, ``input_shapes``,
    ``use_gpu``, ``inference_batch_size`` (1024).

    Example::

        model = est.fit(df)
        model.getHistory()["train_loss"]      # one value per epoch
        model.getModel()                      # the trained torch.nn.Module
        model.transform(test_df)              # + <label>__output columns
        model.write().overwrite().save("/tmp/digits_model")
        same = TorchModel.load("/tmp/digits_model")
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**model_defaults())
        reject_unknown("TorchModel", kwargs, (p.name for p in self.params))
        self._set(**kwargs)
        self._timings: Dict[str, Any] = {}
        self._start_epoch = 0

    def getTimings(self) -> Dict[str, Any]:
        """Where the time of the ``fit`` that made this model went (empty for a loaded model):
        ``first_step`` (unix time the first training step started on rank 0) and ``parts``,
        seconds of ``prepare`` (data preparation; 0 when reused or ``fit_on_parquet``),
        ``launch`` (``kolo.spark.run`` call to the first step: barrier stage, rank start,
        ``hvd.init``, model and loader set-up, broadcasts), ``train`` (epochs, validation
        included, on rank 0), ``checkpoint`` (rank 0's writes) and ``model_return`` (rank 0's
        return to the trained model on the driver: TensorBoard sync, result transfer, ranks'
        exit, loading the weights).

        Example::

            parts = model.getTimings()["parts"]
            print(f"launch {parts['launch']:.2f} s, train {parts['train']:.2f} s")
        """
        return dict(self._timings)

    def getOutputCols(self) -> List[str]:
        """The output column names: those set, else ``<label>__output`` for each label."""
        cols = self.getOrDefault(self.output_cols)
        if cols:
            return list(cols)
        return [f"{label}__output" for label in self.getLabelColumns() or []]

    def getFeatureColumns(self) -> List[str]:
        """The feature column names."""
        return list(self.getOrDefault(self.feature_columns) or [])

    def getLabelColumns(self) -> List[str]:
        """The label column names."""
        return list(self.getOrDefault(self.label_columns) or [])

    # -- persistence ---------------------------------------------------------------------------

    def write(self) -> KoloWriter:
        """A writer that saves the model and its parameters (``write().save(path)``)."""
        return KoloWriter(self)

    @classmethod
    def read(cls) -> KoloReader:
        """A reader of what :meth:`write` saved."""
        return KoloReader(cls)

    # -- inference -------------------------------------------------------------------------------

    def _output_sizes(self, model: Any) -> List[Optional[int]]:
        """Values per row of each output (None: one value, a double column), from running the
        model on two rows of zeros shaped like the training data."""
        import numpy as np
        import torch

        columns = (self.getMetadata() or {}).get("columns", {})
        shapes = self.getInputShapes()
        inputs = []
        for i, name in enumerate(self.getFeatureColumns()):
            info = columns.get(name, {})
            shape = tuple(info.get("shape") or ())
            dtype = _numpy_dtype(info.get("dtype"))
            x = torch.from_numpy(np.zeros((2, *shape), dtype=dtype))
            if x.dtype == torch.float64:
                x = x.float()
            if shapes:
                x = x.reshape(shapes[i])
            inputs.append(x)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                outputs = model(*inputs)
        finally:
            model.train(was_training)
        if not isinstance(outputs, (tuple, list)):
            outputs = [outputs]
        labels = self.getLabelColumns()
        if len(outputs) != len(labels):
            raise InvalidArgumentError(
                f"the model returns {len(outputs)} outputs for {len(labels)} label columns: "
                "return one output per label"
            )
        sizes = []
        for out in outputs:
            per_row = int(np.prod(out.shape[1:])) if out.dim() > 1 else 1
            sizes.append(None if per_row == 1 else per_row)
        return sizes

    def _transform(self, df: Any) -> Any:
        model = self.getModel()
        if model is None:
            raise InvalidArgumentError("this TorchModel has no model")
        payload = cloudpickle.dumps(
            {"model": model, "input_shapes": self.getInputShapes(), "use_gpu": self.getUseGpu()}
        )
        return predict_columns(
            df,
            self.getFeatureColumns(),
            self.getOutputCols(),
            self._output_sizes(model),
            payload,
            _Predictor,
            self.getInferenceBatchSize(),
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


class _Predictor:
    """The pandas UDF body: feature columns in (one pandas batch), model outputs out."""

    def __init__(
        self, broadcast: Any, out_cols: List[str], sizes: List[Optional[int]], batch_size: int
    ) -> None:
        self.broadcast = broadcast
        self.key = uuid.uuid4().hex
        self.out_cols = out_cols
        self.sizes = sizes
        self.batch_size = max(1, batch_size)

    def _load(self) -> Tuple[Any, Any, Any]:
        import torch
        from pyspark import TaskContext

        context = TaskContext.get()
        # one intra-op thread per task CPU: the executor runs several tasks at once
        torch.set_num_threads(max(1, context.cpus() if context is not None else 1))
        key = self.key
        with _LOADED_LOCK:
            if _LOADED.get("key") != key:
                payload = cloudpickle.loads(self.broadcast.value)
                device = torch.device("cpu")
                if payload["use_gpu"] and torch.cuda.is_available():
                    gpus = context.resources().get("gpu") if context is not None else None
                    if gpus is not None and gpus.addresses:
                        device = torch.device("cuda", int(gpus.addresses[0]))
                model = payload["model"].to(device)
                model.eval()
                _LOADED.clear()
                _LOADED.update(key=key, model=model, device=device, shapes=payload["input_shapes"])
            return _LOADED["model"], _LOADED["device"], _LOADED["shapes"]

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

    def _predict(self, columns: List[Any]) -> List[Any]:
        """The outputs for one batch of feature columns (numpy): per output, [rows] doubles
        or [rows, size] doubles."""
        import numpy as np
        import torch

        model, device, shapes = self._load()
        rows = len(columns[0])
        with warnings.catch_warnings():
            # Arrow's buffers are read-only; the model only reads its inputs.
            warnings.simplefilter("ignore", UserWarning)
            columns = [torch.from_numpy(c) for c in columns]
        chunks: List[List[np.ndarray]] = [[] for _ in self.out_cols]
        with torch.no_grad():
            for start in range(0, rows, self.batch_size):
                xs = [c[start : start + self.batch_size].to(device) for c in columns]
                if shapes:
                    xs = [x.reshape(s) for x, s in zip(xs, shapes)]
                outputs = model(*xs)
                if not isinstance(outputs, (tuple, list)):
                    outputs = [outputs]
                for i, out in enumerate(outputs):
                    chunks[i].append(
                        out.detach().to("cpu", torch.float64).reshape(out.shape[0], -1).numpy()
                    )
        results = []
        for parts, size in zip(chunks, self.sizes):
            values = np.concatenate(parts) if parts else np.zeros((0, size or 1))
            results.append(values[:, 0] if size is None else values)
        return results

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
