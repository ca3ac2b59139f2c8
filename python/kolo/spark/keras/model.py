"""``KerasModel``: the Spark ML Transformer a :class:`~kolo.spark.keras.KerasEstimator` returns
(Horovod's ``horovod.spark.keras.KerasModel``), with batched Arrow inference.

``transform(df)`` keeps every input column and adds one output column per label
(``<label>__output`` unless :meth:`KerasModel.setOutputCols` says otherwise): a double for a
model output of one value per row, ``array<double>`` otherwise. It is the UDF of
:mod:`kolo.spark.common._inference`, as for :class:`~kolo.spark.torch.TorchModel` (an Arrow UDF
on Spark >= 4.1, else a pandas UDF; only the feature columns travel to Python): the model
travels once as a broadcast of its ``.keras`` bytes, is loaded once per Python worker with the
model's ``custom_objects``, and each batch is predicted in chunks of ``inference_batch_size``
rows.

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

from typing import Any, List

import cloudpickle

from kolo.estimator.keras_trainer import model_to_bytes
from kolo.spark.common._inference import Predictor
from kolo.spark.common.model import KoloModel
from kolo.spark.common.params import KerasModelParams, keras_model_defaults
from kolo.spark.keras._persistence import KerasReader, keras_writer
from kolo.spark.keras.serde import SavedKerasModel

__all__ = ["KerasModel"]


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


class KerasPredictor(Predictor):
    """The inference UDF's body with a Keras model (see
    :class:`~kolo.spark.common._inference.Predictor`): floats given as ``keras.config.floatx()``,
    features reshaped to the model's inputs where the sizes agree.

    Example::

        predictor = KerasPredictor(broadcast, ["pred"], [None], 1024)
    """

    def _load_model(self, payload: bytes) -> Any:
        # Before the payload's custom objects import Keras: triton before TensorFlow.
        import kolo.keras  # noqa: F401

        loaded = cloudpickle.loads(payload)
        model = loaded["model"].load(loaded["custom_objects"])
        return model, loaded.get("floatx")

    def _inputs(self, loaded: Any, columns: List[Any]) -> List[Any]:
        import keras
        import numpy as np

        floatx = loaded[1] or keras.config.floatx()
        return [c.astype(floatx) if np.issubdtype(c.dtype, np.floating) else c for c in columns]

    def _outputs(self, loaded: Any, inputs: List[Any]) -> List[Any]:
        import keras
        import numpy as np

        model = loaded[0]
        outputs = _outputs_as_list(model.predict_on_batch(_shaped_inputs(model, inputs)))
        results = []
        for out in outputs:
            out = np.asarray(keras.ops.convert_to_numpy(out), dtype=np.float64)
            results.append(out.reshape(out.shape[0], -1))
        return results


class KerasModel(KoloModel, KerasModelParams):
    """A trained Keras model as a Spark ML Transformer.

    Parameters (each with ``getX``/``setX``): ``model``, ``history``, ``feature_columns``,
    ``label_columns``, ``output_cols``, ``custom_objects``, ``run_id``, ``metadata``
    (Horovod's ``_metadata=``), ``_floatx`` (the float type features are given to the model
    as in ``transform``; default ``keras.config.floatx()``), ``inference_batch_size`` (1024).

    Example::

        model = est.fit(df)
        model.getHistory()["val_loss"]        # one value per epoch
        model.getModel()                      # the trained keras.Model
        model.transform(test_df)              # + <label>__output columns
        model.write().overwrite().save("/tmp/digits_keras")
        same = KerasModel.load("/tmp/digits_keras")
    """

    _param_defaults = staticmethod(keras_model_defaults)
    _predictor = KerasPredictor

    _writer = staticmethod(keras_writer)
    _reader = KerasReader

    def _payload(self, model: Any) -> bytes:
        return cloudpickle.dumps(
            {
                "model": SavedKerasModel(model_to_bytes(model)),
                "custom_objects": self.getCustomObjects(),
                "floatx": self._get_floatx(),
            }
        )

    def _sample_outputs(self, model: Any) -> List[Any]:
        import keras
        import numpy as np

        columns = (self.getMetadata() or {}).get("columns", {})
        inputs = []
        for name in self.getFeatureColumns():
            info = columns.get(name, {})
            dtype = np.dtype(info.get("dtype") or "float32")
            if np.issubdtype(dtype, np.floating):
                dtype = np.dtype(self._get_floatx() or keras.config.floatx())
            inputs.append(np.zeros((2, *(info.get("shape") or ())), dtype=dtype))
        return _outputs_as_list(model.predict_on_batch(_shaped_inputs(model, inputs)))
