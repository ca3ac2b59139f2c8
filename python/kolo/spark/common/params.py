"""The Spark ML parameters of kolo's estimators and models, with Horovod's names and defaults:
the rows of the estimator core's one table (:mod:`kolo.estimator.params`) declared as Spark
ML ``Param`` objects, plus the Spark-only ones.

:class:`EstimatorParams` holds what every kolo estimator takes (``num_proc``, ``store``,
``model``, ``loss``, ``feature_cols``, ``validation``, ``epochs``, ...); :class:`ModelParams`
what a trained model carries (``model``, ``history``, ``run_id``, ``output_cols``, ...); the
``Torch``, ``Lightning`` and ``Keras`` subclasses add each framework's own. Each
parameter ``x_y`` has Spark ML style accessors ``getXY()`` / ``setXY(value)`` (Horovod's
spelling: ``setFeatureCols``, ``getBatchSize``, ``setTrainStepsPerEpoch``...), and the
constructors take the parameters as keyword arguments.

Example::

    from kolo.spark.torch import TorchEstimator

    est = TorchEstimator(num_proc=2, feature_cols=["features"], label_cols=["label"])
    est.setBatchSize(64).setEpochs(5)
    assert est.getBatchSize() == 64 and est.getShuffle() is True
"""

from __future__ import annotations

from typing import Any, Dict, List

from pyspark.ml.param import Param, Params, TypeConverters

from kolo.estimator.params import (
    CUSTOM_OBJECTS_PARAM,
    KERAS_PARAMS,
    LIGHTNING_PARAMS,
    TORCH_PARAMS,
    TRAINING_PARAMS,
    ParamSpec,
)

__all__ = [
    "EstimatorParams",
    "KerasEstimatorParams",
    "KerasModelParams",
    "LightningEstimatorParams",
    "ModelParams",
    "TorchEstimatorParams",
    "TorchModelParams",
    "accessor_name",
    "estimator_defaults",
    "keras_estimator_defaults",
    "keras_model_defaults",
    "lightning_estimator_defaults",
    "model_defaults",
    "torch_estimator_defaults",
    "torch_model_defaults",
]


def accessor_name(param_name: str) -> str:
    """``feature_cols`` → ``FeatureCols`` (the suffix of ``getFeatureCols``/``setFeatureCols``).

    Example::

        assert accessor_name("train_steps_per_epoch") == "TrainStepsPerEpoch"
    """
    return "".join(part[:1].upper() + part[1:] for part in param_name.split("_"))


#: Horovod's accessors whose names are not ``accessor_name(param)``: param → Horovod's suffix
#: (``getShufflingBufferSize``...); both spellings exist.
_HOROVOD_SUFFIXES = {
    "shuffle_buffer_size": "ShufflingBufferSize",
    "train_reader_num_workers": "TrainReaderNumWorker",
    "val_reader_num_workers": "ValReaderNumWorker",
    "inmemory_cache_all": "InMemoryCacheAll",
    "num_gpus": "NumGPUs",
}


def _declare(cls: type, specs: List[ParamSpec]) -> Dict[str, Any]:
    """Adds a ``Param`` plus ``getX``/``setX`` to ``cls`` for each ``(name, doc, default,
    converter)``; returns the defaults to pass to ``_setDefault``."""
    defaults = {}
    for name, doc, default, converter in specs:
        if converter is None:
            param = Param(Params._dummy(), name, doc)
        else:
            param = Param(
                Params._dummy(), name, doc, typeConverter=getattr(TypeConverters, converter)
            )
        setattr(cls, name, param)
        suffix = accessor_name(name)

        def getter(self: Params, _name: str = name) -> Any:
            return self.getOrDefault(getattr(self, _name))

        def setter(self: Params, value: Any, _name: str = name) -> Params:
            return self._set(**{_name: value})

        getter.__doc__ = f"The value of ``{name}``: {doc}"
        setter.__doc__ = f"Sets ``{name}``: {doc} Returns ``self``."
        for spelling in {suffix, _HOROVOD_SUFFIXES.get(name, suffix)}:
            if not hasattr(cls, f"get{spelling}"):
                setattr(cls, f"get{spelling}", _named(getter, f"get{spelling}"))
            if not hasattr(cls, f"set{spelling}"):
                setattr(cls, f"set{spelling}", _named(setter, f"set{spelling}"))
        defaults[name] = default
    return defaults


def _named(fn: Any, name: str) -> Any:
    """A copy of the accessor ``fn`` named ``name``."""

    def accessor(self: Params, *args: Any) -> Any:
        return fn(self, *args)

    accessor.__name__ = accessor.__qualname__ = name
    accessor.__doc__ = fn.__doc__
    return accessor


#: The Spark estimator's own parameters (the others are :data:`TRAINING_PARAMS`).
_SPARK_ESTIMATOR_PARAMS: List[ParamSpec] = [
    (
        "num_proc",
        "number of training processes (ranks); default: Spark's default parallelism",
        None,
        None,
    ),
    (
        "backend",
        "the kolo.spark.common.backend.Backend that starts the ranks (default kolo.spark.run)",
        None,
        None,
    ),
    (
        "compress_sparse_cols",
        "accepted for Horovod compatibility; sparse vectors are written dense",
        False,
        "toBoolean",
    ),
    (
        "use_gpu",
        "train (and predict) on the GPU assigned to the rank when there is one",
        True,
        "toBoolean",
    ),
]

_MODEL_PARAMS: List[ParamSpec] = [
    ("history", "per-epoch metrics of the training run", None, None),
    ("model", "the trained model", None, None),
    ("feature_columns", "feature column names", None, "toListString"),
    ("label_columns", "label column names", None, "toListString"),
    (
        "output_cols",
        "output column names (default: <label>__output)",
        None,
        "toListString",
    ),
    ("run_id", "id of the training run", None, None),
    ("metadata", "dataset metadata: column dtypes and shapes, output shapes", None, None),
    ("input_shapes", "shapes the feature tensors are reshaped to", None, None),
    (
        "use_gpu",
        "predict on the GPU assigned to the Spark task when there is one",
        True,
        "toBoolean",
    ),
    ("inference_batch_size", "rows per model call in transform", 1024, "toInt"),
]


class EstimatorParams(Params):
    """Horovod's estimator parameters (``horovod.spark.common.params.EstimatorParams``)."""


class TorchEstimatorParams(EstimatorParams):
    """:class:`EstimatorParams` plus the PyTorch ones (``input_shapes``,
    ``loss_constructors``, ``train_minibatch_fn``)."""


class LightningEstimatorParams(EstimatorParams):
    """:class:`EstimatorParams` plus Horovod's Lightning ones (``trainer_args``, ``logger``,
    ``log_every_n_steps``, ``terminate_on_nan``, ``profiler``, ``num_gpus``) and
    ``input_shapes``."""


class KerasEstimatorParams(EstimatorParams):
    """:class:`EstimatorParams` plus the Keras ones (``custom_objects``,
    ``checkpoint_callback``, ``backend_env``)."""


class ModelParams(Params):
    """Horovod's model parameters (``horovod.spark.common.params.ModelParams``). Horovod's
    ``_metadata`` is ``metadata`` (``_metadata=`` is accepted by the models' constructors, and
    ``model._metadata`` is the same parameter).

    Example::

        model.getMetadata() == model._get_metadata()
    """

    def _get_metadata(self) -> Any:
        """Horovod's internal accessor of ``_metadata``: :meth:`getMetadata`."""
        return self.getOrDefault(self.metadata)

    def setLabelColoumns(self, value: Any) -> Params:
        """Horovod's (misspelt) setter of ``label_columns``: ``setLabelColumns``."""
        return self._set(label_columns=value)


class TorchModelParams(ModelParams):
    """:class:`ModelParams` plus Horovod's ``TorchModel`` ones (``optimizer``, ``loss``,
    ``loss_constructors``)."""


class KerasModelParams(ModelParams):
    """:class:`ModelParams` plus ``custom_objects`` and Horovod's ``_floatx``."""

    def _get_floatx(self) -> Any:
        """Horovod's internal accessor of ``_floatx``."""
        return self.getOrDefault(self._floatx)


_ESTIMATOR_DEFAULTS = _declare(EstimatorParams, [*_SPARK_ESTIMATOR_PARAMS, *TRAINING_PARAMS])
_TORCH_DEFAULTS = _declare(TorchEstimatorParams, TORCH_PARAMS)
_LIGHTNING_DEFAULTS = _declare(LightningEstimatorParams, LIGHTNING_PARAMS)
_KERAS_DEFAULTS = _declare(KerasEstimatorParams, KERAS_PARAMS)
_MODEL_DEFAULTS = _declare(ModelParams, _MODEL_PARAMS)
ModelParams._metadata = ModelParams.metadata  # Horovod's name of the parameter
_TORCH_MODEL_DEFAULTS = _declare(
    TorchModelParams,
    [
        ("optimizer", "the optimizer of the training run, with its trained state", None, None),
        ("loss", "the loss (or losses) of the training run", None, None),
        ("loss_constructors", "the loss constructors of the training run", None, None),
    ],
)
_KERAS_MODEL_DEFAULTS = _declare(
    KerasModelParams,
    [
        CUSTOM_OBJECTS_PARAM,
        ("_floatx", "keras.config.floatx() of the training run, used in transform", None, None),
    ],
)


def estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`EstimatorParams` (for ``_setDefault``)."""
    return dict(_ESTIMATOR_DEFAULTS)


def torch_estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`TorchEstimatorParams`."""
    return {**_ESTIMATOR_DEFAULTS, **_TORCH_DEFAULTS}


def model_defaults() -> Dict[str, Any]:
    """Defaults of :class:`ModelParams`."""
    return dict(_MODEL_DEFAULTS)


def torch_model_defaults() -> Dict[str, Any]:
    """Defaults of :class:`TorchModelParams`."""
    return {**_MODEL_DEFAULTS, **_TORCH_MODEL_DEFAULTS}


def lightning_estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`LightningEstimatorParams`.

    Example::

        assert lightning_estimator_defaults()["log_every_n_steps"] == 50
    """
    return {**_ESTIMATOR_DEFAULTS, **_LIGHTNING_DEFAULTS}


def keras_estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`KerasEstimatorParams`."""
    return {**_ESTIMATOR_DEFAULTS, **_KERAS_DEFAULTS}


def keras_model_defaults() -> Dict[str, Any]:
    """Defaults of :class:`KerasModelParams`."""
    return {**_MODEL_DEFAULTS, **_KERAS_MODEL_DEFAULTS}
