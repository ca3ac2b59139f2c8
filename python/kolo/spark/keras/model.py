"""``KerasModel``: the Spark ML Transformer a :class:`~kolo.spark.keras.KerasEstimator` returns
(Horovod's ``horovod.spark.keras.KerasModel``), with batched Arrow inference.

``transform(df)`` keeps every input column and adds one output column per label
(``<label>__output`` unless :meth:`KerasModel.setOutputCols` says otherwise): a double for a
model output of one value per row, ``array<double>`` otherwise. It is the same UDF machinery as
:class:`~kolo.spark.torch.TorchModel` (an Arrow UDF on Spark >= 4.1, else a pandas UDF; only
the feature columns travel to Python): the model travels once as a broadcast of its ``.keras``
bytes, is loaded once per Python worker with the model's ``custom_objects``, and each batch is
predicted in chunks of ``inference_batch_size`` rows.

Example::

    predictions = keras_model.setOutputCols(["pred"]).transform(test_df)
    predictions.select("label", "pred").show()
"""

from __future__ import annotations

# First, before anything in this process imports Keras (and with it TensorFlow): triton. A
# Spark Python worker that ran a Keras transform may run a torch model's next, and triton
# loaded after TensorFlow aborts the process (docs/keras.md).
from kolo.keras import _preload  # noqa: F401

# isort: split

import logging
import threading
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle
from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from kolo.exceptions import InvalidArgumentError
from kolo.spark.common.inference import predict_columns
from kolo.spark.common.serialization import KoloReader, KoloWriter
from kolo.spark.common.training_params import reject_unknown
from kolo.spark.keras.params import KerasModelParams, keras_model_defaults
from kolo.spark.keras.persistence import KerasReader, keras_writer
from kolo.spark.keras.serde import SavedKerasModel, model_to_bytes
from kolo.spark.torch.model import _Predictor

__all__ = ["KerasModel"]

log = logging.getLogger(__name__)

#: The model loaded in this Python worker.
_LOADED: Dict[str, Any] = {}
_LOADED_LOCK = threading.Lock()


def _shaped_inputs(model: Any, columns: List[Any]) -> Any:
    """Feature arrays reshaped to the model's input shapes where the sizes agree (a 64-vector
    for an ``(8, 8, 1)`` input); one array, or a list for several inputs."""
    import numpy as np

    shaped = []
    inputs = list(getattr(model, "inputs", None) or [])
    for i, x in enumerate(columns):
        if i < len(inputs):
            want = tuple(inputs[i].shape[1:])
            if None not in want and x.shape[1:] != want:
                if int(np.prod(x.shape[1:])) == int(np.prod(want)):
                    x = x.reshape((-1, *want))
        shaped.append(x)
    return shaped[0] if len(shaped) == 1 else shaped


def _outputs_as_list(outputs: Any) -> List[Any]:
    if isinstance(outputs, dict):
        return list(outputs.values())
    if isinstance(outputs, (list, tuple)):
        return list(outputs)
    return [outputs]


class _KerasPredictor(_Predictor):
    """The UDF body of :class:`~kolo.spark.torch.model._Predictor` with a Keras model."""

    def _load(self) -> Tuple[Any, Any, Any]:
        key = self.key
        with _LOADED_LOCK:
            if _LOADED.get("key") != key:
                # Before the payload's custom objects import Keras: triton before TensorFlow.
                import kolo.keras  # noqa: F401

                payload = cloudpickle.loads(self.broadcast.value)
                model = payload["model"].load(payload["custom_objects"])
                _LOADED.clear()
                _LOADED.update(key=key, model=model)
            return _LOADED["model"], None, None

    def _predict(self, columns: List[Any]) -> List[Any]:
        import keras
        import numpy as np

        model, _, _ = self._load()
        floatx = keras.config.floatx()
        columns = [c.astype(floatx) if np.issubdtype(c.dtype, np.floating) else c for c in columns]
        rows = len(columns[0])
        chunks: List[List[Any]] = [[] for _ in self.out_cols]
        for start in range(0, rows, self.batch_size):
            xs = _shaped_inputs(model, [c[start : start + self.batch_size] for c in columns])
            outputs = _outputs_as_list(model.predict_on_batch(xs))
            for i, out in enumerate(outputs):
                out = np.asarray(keras.ops.convert_to_numpy(out), dtype=np.float64)
                chunks[i].append(out.reshape(out.shape[0], -1))
        results = []
        for parts, size in zip(chunks, self.sizes):
            values = np.concatenate(parts) if parts else np.zeros((0, size or 1))
            results.append(values[:, 0] if size is None else values)
        return results


class KerasModel(Model, KerasModelParams, MLReadable, MLWritable):
    """A trained Keras model as a Spark ML Transformer.

    Parameters (each with ``getX``/``setX``): ``model``, ``history``, ``feature_columns``,
    ``label_columns``, ``output_cols``, ``custom_objects``, ``run_id``, ``metadata``,
    ``inference_batch_size`` (1024).

    Example::

        model = est.fit(df)
        model.getHistory()["val_loss"]        # one value per epoch
        model.getModel()                      # the trained keras.Model
        model.transform(test_df)              # + <label>__output columns
        model.write().overwrite().save("/tmp/digits_keras")
        same = KerasModel.load("/tmp/digits_keras")
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._setDefault(**keras_model_defaults())
        reject_unknown("KerasModel", kwargs, (p.name for p in self.params))
        self._set(**kwargs)
        self._timings: Dict[str, Any] = {}
        self._start_epoch = 0

    def getTimings(self) -> Dict[str, Any]:
        """Where the time of the ``fit`` that made this model went (see
        :meth:`kolo.spark.torch.TorchModel.getTimings`); empty for a loaded model.

        Example::

            print(model.getTimings()["parts"]["train"])
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
        """A writer that saves the model (a ``.keras`` archive) and its parameters.

        Example::

            model.write().overwrite().save("/tmp/digits_keras")
        """
        return keras_writer(self)

    @classmethod
    def read(cls) -> KoloReader:
        """A reader of what :meth:`write` saved.

        Example::

            model = KerasModel.read().load("/tmp/digits_keras")
        """
        return KerasReader(cls)

    # -- inference -------------------------------------------------------------------------------

    def _output_sizes(self, model: Any) -> List[Optional[int]]:
        """Values per row of each output (None: one value, a double column), from running the
        model on two rows of zeros shaped like the training data."""
        import keras
        import numpy as np

        columns = (self.getMetadata() or {}).get("columns", {})
        inputs = []
        for name in self.getFeatureColumns():
            info = columns.get(name, {})
            dtype = np.dtype(info.get("dtype") or "float32")
            if np.issubdtype(dtype, np.floating):
                dtype = np.dtype(keras.config.floatx())
            inputs.append(np.zeros((2, *(info.get("shape") or ())), dtype=dtype))
        outputs = _outputs_as_list(model.predict_on_batch(_shaped_inputs(model, inputs)))
        labels = self.getLabelColumns()
        if len(outputs) != len(labels):
            raise InvalidArgumentError(
                f"the model returns {len(outputs)} outputs for {len(labels)} label columns: "
                "return one output per label"
            )
        sizes = []
        for out in outputs:
            per_row = int(np.prod(out.shape[1:])) if len(out.shape) > 1 else 1
            sizes.append(None if per_row == 1 else per_row)
        return sizes

    def _transform(self, df: Any) -> Any:
        model = self.getModel()
        if model is None:
            raise InvalidArgumentError("this KerasModel has no model")
        payload = cloudpickle.dumps(
            {
                "model": SavedKerasModel(model_to_bytes(model)),
                "custom_objects": self.getCustomObjects(),
            }
        )
        return predict_columns(
            df,
            self.getFeatureColumns(),
            self.getOutputCols(),
            self._output_sizes(model),
            payload,
            _KerasPredictor,
            self.getInferenceBatchSize(),
        )
