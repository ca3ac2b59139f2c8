"""``KerasEstimator``: a Spark ML Estimator that trains a Keras 3 model with kolo on Spark
executors and returns a :class:`~kolo.spark.keras.KerasModel` (Horovod's
``horovod.spark.keras.KerasEstimator``). The flow (checks, data preparation, launch, progress,
resume by ``run_id``, persistence) is :class:`~kolo.spark.common.estimator.KoloEstimator`'s;
this module adds the Keras checks, the rank's training function (the estimator core's
:class:`~kolo.estimator.keras_trainer.KerasTrainer`) and the model it returns.

Example::

    import keras
    from kolo.spark.common.store import Store
    from kolo.spark.keras import KerasEstimator

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    est = KerasEstimator(
        num_proc=2,
        store=Store.create("/tmp/kolo-store"),
        model=model,
        optimizer=keras.optimizers.Adam(0.001),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.1,
        batch_size=32,
        epochs=10,
    )
    keras_model = est.fit(train_df)
    predictions = keras_model.transform(test_df)   # adds label__output
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from kolo.estimator.checks import FIX_FN, check_shapes, pickled
from kolo.estimator.dataset import PreparedDataset
from kolo.estimator.keras_trainer import KerasSpec, KerasTrainer, model_from_bytes, model_to_bytes
from kolo.estimator.spec import spec_fields
from kolo.exceptions import InvalidArgumentError
from kolo.spark.common.estimator import KoloEstimator
from kolo.spark.common.params import KerasEstimatorParams, keras_estimator_defaults
from kolo.spark.keras._persistence import KerasReader, keras_writer
from kolo.spark.keras.model import KerasModel

__all__ = ["KerasEstimator"]


def _serialized_optimizer(keras: Any, optimizer: Any) -> Dict[str, Any]:
    """``keras.optimizers.serialize(optimizer)``, a built-in named by its public path
    (``keras.optimizers.SGD``): each backend has its own class behind that name, and a rank
    may run another backend than the driver (``backend_env``)."""
    serialized = keras.optimizers.serialize(optimizer)
    public = getattr(keras.optimizers, type(optimizer).__name__, None)
    if type(optimizer).__module__.startswith("keras.") and isinstance(public, type):
        serialized = {
            "module": "keras.optimizers",
            "class_name": type(optimizer).__name__,
            "config": serialized["config"],
            "registered_name": None,
        }
    return serialized


class KerasEstimator(KoloEstimator, KerasEstimatorParams):
    """Trains a Keras 3 model on a Spark DataFrame with kolo (Horovod's parameters).

    Keyword arguments are the parameters (each also has ``getX``/``setX``):

    - ``num_proc``: ranks (default: Spark's default parallelism); ``store``: a
      :class:`kolo.store.Store` for the prepared data, checkpoints and logs.
    - ``model`` (a ``keras.Model``), ``optimizer`` (a ``keras.optimizers.Optimizer``; each rank
      builds one from its config with the learning rate multiplied by the number of ranks, as
      Horovod does; default: the compiled model's), ``loss`` (as for ``model.compile``; default:
      the compiled model's), ``loss_weights``, ``metrics`` (as for ``model.compile``; averaged
      over the ranks), ``callbacks`` (Keras callbacks run on every rank), ``custom_objects``
      (what loading the model needs), ``checkpoint_callback`` (a
      :class:`kolo.keras.callbacks.BestModelCheckpoint`: the returned model is its best
      epoch), ``backend_env`` (environment of the ranks, e.g. ``{"KERAS_BACKEND": "torch"}``).
    - ``feature_cols``, ``label_cols``, ``sample_weight_col``, ``validation`` (ratio or column),
      ``label_shapes`` (reshape, batch dimension included), ``transformation_fn``
      (``fn(batch dict of numpy arrays) -> batch dict``). Features are reshaped to the
      model's input shapes when the sizes agree (a 64-vector for an ``(8, 8, 1)`` input).
    - ``batch_size`` (32), ``val_batch_size``, ``epochs`` (1), ``train_steps_per_epoch``,
      ``validation_steps_per_epoch``, ``shuffle`` (True), ``random_seed``,
      ``partitions_per_process`` (10), ``backward_passes_per_step`` (1; the mean of the
      accumulated gradients is applied), ``gradient_compression``
      (``kolo.keras.Compression.fp16``/``.bf16``), ``verbose`` (1), ``run_id`` (an existing
      checkpoint of this id resumes training).
    - Horovod's loader settings, as for :class:`kolo.spark.torch.TorchEstimator` (a
      ``data_module``'s batches are dicts of numpy arrays). ``use_gpu``: Keras places the
      model itself; ``use_gpu=False`` hides the GPUs from the rank, as Horovod
      pins it to the CPU. No effect (warned once, listed in
      :data:`kolo.estimator.params.NO_EFFECT`): ``compress_sparse_cols``.

    Example::

        est = KerasEstimator(num_proc=2, store=store, model=model, optimizer=opt, loss="mse",
                             feature_cols=["x"], label_cols=["y"], epochs=5)
        model = est.fit(df)
        model.getHistory()["loss"]
    """

    _param_defaults = staticmethod(keras_estimator_defaults)

    _writer = staticmethod(keras_writer)
    _reader = KerasReader

    # -- checks ----------------------------------------------------------------------------------

    def _optimizer(self) -> Any:
        import keras

        from kolo.keras.optimizer import is_distributed

        optimizer = self.getOptimizer()
        if optimizer is None:
            optimizer = getattr(self.getModel(), "optimizer", None)
        if optimizer is None:
            raise InvalidArgumentError(
                "optimizer is not set: pass optimizer=keras.optimizers.Adam(...) (or compile "
                "the model with one)"
            )
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise InvalidArgumentError(
                f"optimizer must be a keras.optimizers.Optimizer, got {type(optimizer).__name__}"
                " (torch optimizers go with kolo.spark.torch.TorchEstimator)"
            )
        if is_distributed(optimizer):
            raise InvalidArgumentError(
                "optimizer is already a kolo.keras.DistributedOptimizer: pass the plain Keras "
                "optimizer; every rank wraps it"
            )
        return optimizer

    def _loss(self) -> Any:
        loss = self.getLoss()
        if loss is None:
            loss = getattr(self.getModel(), "loss", None)
        if loss is None:
            raise InvalidArgumentError(
                'loss is not set: pass loss="sparse_categorical_crossentropy" (or a Keras loss, '
                "or a list with one per label column)"
            )
        return loss

    def get_model_class(self) -> type:
        """The Transformer class ``fit`` returns (Horovod's ``get_model_class``).

        Example::

            assert KerasEstimator().get_model_class() is KerasModel
        """
        return KerasModel

    def get_model_shapes(self) -> Tuple[List[List[int]], List[List[int]]]:
        """The model's input and output shapes, ``-1`` for an unknown dimension (Horovod's
        ``get_model_shapes``).

        Example::

            inputs, outputs = est.get_model_shapes()   # ([[-1, 8]], [[-1, 1]])
        """
        model = self.getModel()

        def shape(tensor: Any) -> List[int]:
            return [-1 if dim is None else int(dim) for dim in tensor.shape]

        return [shape(x) for x in model.inputs], [shape(y) for y in model.outputs]

    def _check_params(self) -> None:
        import keras

        model = self.getModel()
        if model is None:
            raise InvalidArgumentError("model is not set: pass model=<a keras.Model>")
        if not isinstance(model, keras.Model):
            raise InvalidArgumentError(
                f"model must be a keras.Model, got {type(model).__name__} (torch modules go with "
                "kolo.spark.torch.TorchEstimator)"
            )
        self._optimizer()
        loss = self._loss()
        labels = self.getLabelCols()
        if isinstance(loss, (list, tuple)) and len(loss) != len(labels):
            raise InvalidArgumentError(
                f"{len(loss)} losses for {len(labels)} label columns: give one loss, or one "
                "per label column"
            )
        check_shapes(self.getLabelShapes(), labels, "label_shapes", "label")
        callback = self.getCheckpointCallback()
        if callback is not None:
            if not isinstance(callback, keras.callbacks.ModelCheckpoint):
                raise InvalidArgumentError(
                    "checkpoint_callback must be a kolo.keras.callbacks.BestModelCheckpoint (or a "
                    f"keras.callbacks.ModelCheckpoint), got {type(callback).__name__}"
                )
            if callback.save_weights_only:
                raise InvalidArgumentError(
                    "checkpoint_callback must save the whole model: pass save_weights_only=False"
                )
        env = self.getBackendEnv()
        if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) for k in env)):
            raise InvalidArgumentError(
                'backend_env must be a dict of environment variables, e.g. {"KERAS_BACKEND": '
                f'"torch"}}, got {env!r}'
            )
        compression = self.getGradientCompression()
        if compression is not None:
            from kolo.keras.compression import Compressor

            if not (isinstance(compression, type) and issubclass(compression, Compressor)):
                raise InvalidArgumentError(
                    "gradient_compression must be kolo.keras.Compression.none, .fp16 or .bf16, "
                    f"got {compression!r}"
                )
        self._objects_bytes()

    def _objects_bytes(self) -> bytes:
        import keras

        optimizer = self._optimizer()
        objects = {
            "optimizer": _serialized_optimizer(keras, optimizer),
            "loss": self._loss(),
            "loss_weights": self.getLossWeights(),
            "metrics": self.getMetrics(),
            "callbacks": self.getCallbacks(),
            "custom_objects": self.getCustomObjects(),
            "checkpoint_callback": self.getCheckpointCallback(),
            "transformation_fn": self.getTransformationFn(),
            "compression": self.getGradientCompression(),
        }
        return pickled("loss, metrics, callbacks or custom objects", objects, FIX_FN)

    def _model_bytes(self) -> bytes:
        try:
            return model_to_bytes(self.getModel())
        except Exception as err:
            raise InvalidArgumentError(
                f"the model cannot be saved as a .keras file to send it to the ranks ({err}): "
                "give custom layers get_config() and pass them in custom_objects"
            ) from err

    # -- hooks -----------------------------------------------------------------------------------

    def _rank_env(self) -> Dict[str, str]:
        """``backend_env``, and with ``use_gpu=False`` no GPU visible to the rank (Horovod's
        Keras ranks pin themselves to the CPU then)."""
        env = dict(self.getBackendEnv() or {})
        if not self.getUseGpu():
            env.setdefault("CUDA_VISIBLE_DEVICES", "")
        return env

    def _remote_trainer(self, store: Any, meta: PreparedDataset, run_id: str) -> KerasTrainer:
        spec = KerasSpec(
            **spec_fields(self._param, store, run_id, meta),
            model_bytes=self._model_bytes(),
            objects_bytes=self._objects_bytes(),
            backend_env=self._rank_env(),
        )
        return KerasTrainer(spec)

    def _make_model(
        self, result: Dict[str, Any], run_id: str, metadata: Dict[str, Any]
    ) -> KerasModel:
        import keras

        custom = self.getCustomObjects()
        return KerasModel(
            model=model_from_bytes(result["model"], custom),
            history=result["history"],
            feature_columns=self.getFeatureCols(),
            label_columns=self.getLabelCols(),
            custom_objects=custom,
            run_id=run_id,
            _metadata=metadata,
            _floatx=keras.config.floatx(),
        )
