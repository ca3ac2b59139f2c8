"""``TorchModel``: the Spark ML Transformer a :class:`~kolo.spark.torch.TorchEstimator`
returns (Horovod's ``horovod.spark.torch.TorchModel``), with batched Arrow inference.

``transform(df)`` keeps every input column and adds one output column per label
(``<label>__output`` unless :meth:`TorchModel.setOutputCols` says otherwise): a double for a
model output of one value per row, ``array<double>`` otherwise. Inference is the UDF of
:mod:`kolo.spark.common._inference` over the feature columns only (the other columns stay in
the JVM): the model travels once as a broadcast and is loaded once per Python worker, and each
Arrow batch is predicted in chunks of ``inference_batch_size`` rows (on the task's GPU when
``use_gpu`` and Spark assigned one).

Example::

    predictions = torch_model.setOutputCols(["pred"]).transform(test_df)
    predictions.select("label", "pred").show()
"""

from __future__ import annotations

import warnings
from typing import Any, List, Tuple

import cloudpickle

from kolo.spark.common._inference import Predictor
from kolo.spark.common.model import KoloModel
from kolo.spark.common.params import TorchModelParams, torch_model_defaults

__all__ = ["TorchModel"]


class TorchPredictor(Predictor):
    """The inference UDF's body with a PyTorch model (see
    :class:`~kolo.spark.common._inference.Predictor`): the model on the task's GPU when
    ``use_gpu`` and Spark assigned one, one intra-op thread per task CPU.

    Example::

        predictor = TorchPredictor(broadcast, ["pred"], [None], 1024)
    """

    def _load_model(self, payload: bytes) -> Tuple[Any, Any, Any]:
        import torch
        from pyspark import TaskContext

        loaded = cloudpickle.loads(payload)
        device = torch.device("cpu")
        if loaded["use_gpu"] and torch.cuda.is_available():
            context = TaskContext.get()
            gpus = context.resources().get("gpu") if context is not None else None
            if gpus is not None and gpus.addresses:
                device = torch.device("cuda", int(gpus.addresses[0]))
        model = loaded["model"].to(device)
        model.eval()
        return model, device, loaded["input_shapes"]

    def _inputs(self, loaded: Any, columns: List[Any]) -> List[Any]:
        import torch
        from pyspark import TaskContext

        context = TaskContext.get()
        # one intra-op thread per task CPU: the executor runs several tasks at once
        torch.set_num_threads(max(1, context.cpus() if context is not None else 1))
        with warnings.catch_warnings():
            # Arrow's buffers are read-only; the model only reads its inputs.
            warnings.simplefilter("ignore", UserWarning)
            return [torch.from_numpy(c) for c in columns]

    def _outputs(self, loaded: Any, inputs: List[Any]) -> List[Any]:
        import torch

        model, device, shapes = loaded
        xs = [x.to(device) for x in inputs]
        if shapes:
            xs = [x.reshape(s) for x, s in zip(xs, shapes)]
        with torch.no_grad():
            outputs = model(*xs)
        if not isinstance(outputs, (tuple, list)):
            outputs = [outputs]
        return [
            out.detach().to("cpu", torch.float64).reshape(out.shape[0], -1).numpy()
            for out in outputs
        ]


class TorchModel(KoloModel, TorchModelParams):
    """A trained PyTorch model as a Spark ML Transformer.

    Parameters (each with ``getX``/``setX``): ``model``, ``history``, ``feature_columns``,
    ``label_columns``, ``output_cols``, ``run_id``, ``metadata`` (Horovod's ``_metadata=``),
    ``input_shapes``, ``optimizer`` (with its trained state; ``getOptimizer()`` returns it
    rebuilt on this model's parameters, as Horovod does), ``loss``, ``loss_constructors``,
    ``use_gpu``, ``inference_batch_size`` (1024).

    Example::

        model = est.fit(df)
        model.getHistory()["train_loss"]      # one value per epoch
        model.getModel()                      # the trained torch.nn.Module
        model.transform(test_df)              # + <label>__output columns
        model.write().overwrite().save("/tmp/digits_model")
        same = TorchModel.load("/tmp/digits_model")
    """

    _param_defaults = staticmethod(torch_model_defaults)
    _predictor = TorchPredictor

    def getOptimizer(self) -> Any:
        """The training run's optimizer with its trained state, rebuilt on this model's
        parameters (Horovod's ``TorchModel.getOptimizer``); ``None`` when there is none.

        Example::

            optimizer = model.getOptimizer()   # continue training model.getModel()
        """
        optimizer, model = self.getOrDefault(self.optimizer), self.getModel()
        if optimizer is None or model is None:
            return optimizer
        rebuilt = type(optimizer)(model.parameters(), lr=1)
        rebuilt.load_state_dict(optimizer.state_dict())
        return rebuilt

    def get_prediction_fn(self) -> Any:
        """A function ``predict_fn(model, row)`` that runs ``model`` on one Spark ``Row``: each
        feature column reshaped to its input shape (Horovod's Lightning
        ``TorchModel.get_prediction_fn``).

        Example::

            predict = fitted.get_prediction_fn()
            output = predict(fitted.getModel(), df.first())
        """
        import torch

        input_shapes, feature_cols = self.getInputShapes(), self.getFeatureColumns()

        def predict_fn(model: Any, row: Any) -> Any:
            data = [
                torch.tensor([row[col]]).reshape(shape)
                for col, shape in zip(feature_cols, input_shapes)
            ]
            with torch.no_grad():
                return model(*data)

        return predict_fn

    def _payload(self, model: Any) -> bytes:
        return cloudpickle.dumps(
            {"model": model, "input_shapes": self.getInputShapes(), "use_gpu": self.getUseGpu()}
        )

    def _sample_outputs(self, model: Any) -> List[Any]:
        import numpy as np
        import torch

        columns = (self.getMetadata() or {}).get("columns", {})
        shapes = self.getInputShapes()
        inputs = []
        for i, name in enumerate(self.getFeatureColumns()):
            info = columns.get(name, {})
            zeros = np.zeros((2, *(info.get("shape") or ())), dtype=info.get("dtype") or "float32")
            x = torch.from_numpy(zeros)
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
        return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
