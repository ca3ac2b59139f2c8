"""The Spark ML parameters of kolo's estimators and models, with Horovod's names and defaults.

:class:`EstimatorParams` holds what every kolo estimator takes (``num_proc``, ``store``,
``model``, ``loss``, ``feature_cols``, ``validation``, ``epochs``, ...); :class:`ModelParams`
what a trained model carries (``model``, ``history``, ``run_id``, ``output_cols``, ...). Each
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

from typing import Any, Dict, List, Tuple

from pyspark.ml.param import Param, Params, TypeConverters

__all__ = ["EstimatorParams", "ModelParams", "accessor_name"]


def accessor_name(param_name: str) -> str:
    """``feature_cols`` → ``FeatureCols`` (the suffix of ``getFeatureCols``/``setFeatureCols``).

    Example::

        assert accessor_name("train_steps_per_epoch") == "TrainStepsPerEpoch"
    """
    return "".join(part[:1].upper() + part[1:] for part in param_name.split("_"))


def _declare(cls: type, specs: List[Tuple[str, str, Any, Any]]) -> Dict[str, Any]:
    """Adds a ``Param`` plus ``getX``/``setX`` to ``cls`` for each ``(name, doc, default,
    converter)``; returns the defaults to pass to ``_setDefault``."""
    defaults = {}
    for name, doc, default, converter in specs:
        if converter is None:
            param = Param(Params._dummy(), name, doc)
        else:
            param = Param(Params._dummy(), name, doc, typeConverter=converter)
        setattr(cls, name, param)
        suffix = accessor_name(name)

        def getter(self: Params, _name: str = name) -> Any:
            return self.getOrDefault(getattr(self, _name))

        def setter(self: Params, value: Any, _name: str = name) -> Params:
            return self._set(**{_name: value})

        getter.__doc__ = f"The value of ``{name}``: {doc}"
        setter.__doc__ = f"Sets ``{name}``: {doc} Returns ``self``."
        getter.__name__, setter.__name__ = f"get{suffix}", f"set{suffix}"
        if not hasattr(cls, getter.__name__):
            setattr(cls, getter.__name__, getter)
        if not hasattr(cls, setter.__name__):
            setattr(cls, setter.__name__, setter)
        defaults[name] = default
    return defaults


_ESTIMATOR_PARAMS: List[Tuple[str, str, Any, Any]] = [
    (
        "num_proc",
        "number of training processes (ranks); default: Spark's default parallelism",
        None,
        None,
    ),
    (
        "backend",
        "accepted for Horovod compatibility; kolo always trains through kolo.spark.run",
        None,
        None,
    ),
    ("store", "kolo.store.Store holding the prepared data, checkpoints and logs", None, None),
    ("model", "the model to train", None, None),
    ("optimizer", "the optimizer, built on the model's parameters", None, None),
    ("loss", "the loss function, or a list of them (one per label column)", None, None),
    ("loss_weights", "weights of the losses of several label columns", None, None),
    ("sample_weight_col", "column of per-row loss weights", None, None),
    ("metrics", "metric functions metric(output, label) -> tensor", None, None),
    ("feature_cols", "feature column names", None, TypeConverters.toListString),
    ("label_cols", "label column names", None, TypeConverters.toListString),
    (
        "validation",
        "a ratio of rows (float in [0, 1)) or the name of a bool/int column "
        "marking validation rows",
        None,
        None,
    ),
    (
        "callbacks",
        "objects whose on_epoch_begin/on_train_batch_end/on_epoch_end methods are "
        "called during training",
        None,
        None,
    ),
    ("batch_size", "rows per batch and rank", 32, TypeConverters.toInt),
    ("val_batch_size", "rows per validation batch and rank (default: batch_size)", None, None),
    ("epochs", "number of epochs", 1, TypeConverters.toInt),
    (
        "verbose",
        "0: quiet, 1: progress bar per epoch, 2: per-rank step logs",
        1,
        TypeConverters.toInt,
    ),
    (
        "random_seed",
        "seed of the model initialisation, the validation split and the shuffle",
        None,
        None,
    ),
    ("shuffle", "shuffle the training rows every epoch", True, TypeConverters.toBoolean),
    (
        "shuffle_buffer_size",
        "rows per shuffle window of the loader (default: the loader's)",
        None,
        None,
    ),
    (
        "partitions_per_process",
        "Parquet files written per training process",
        10,
        TypeConverters.toInt,
    ),
    ("run_id", "id of the run; an existing checkpoint of that id resumes training", None, None),
    (
        "train_steps_per_epoch",
        "training steps per epoch (default: one pass over each rank's rows)",
        None,
        None,
    ),
    ("validation_steps_per_epoch", "validation steps per epoch (default: one pass)", None, None),
    (
        "transformation_fn",
        "fn(batch: dict column -> tensor) -> dict, applied to each training and validation batch",
        None,
        None,
    ),
    ("train_reader_num_workers", "decode threads of the training loader", 2, TypeConverters.toInt),
    ("val_reader_num_workers", "decode threads of the validation loader", 2, TypeConverters.toInt),
    (
        "reader_pool_type",
        "accepted for Horovod compatibility (petastorm's pool); kolo's loader uses Rust threads",
        "thread",
        None,
    ),
    (
        "label_shapes",
        "shapes the label tensors are reshaped to (one per label column, "
        "batch dimension included, e.g. [-1, 1])",
        None,
        None,
    ),
    (
        "gradient_compression",
        "kolo.torch.Compression.none/.fp16/.bf16 for gradients on the wire",
        None,
        None,
    ),
    (
        "compress_sparse_cols",
        "accepted for Horovod compatibility; sparse vectors are written dense",
        False,
        TypeConverters.toBoolean,
    ),
    (
        "inmemory_cache_all",
        "accepted for Horovod compatibility; not needed (kolo's loader "
        "keeps its windows in memory and reads pages without decoding)",
        False,
        TypeConverters.toBoolean,
    ),
    (
        "use_gpu",
        "train (and predict) on the GPU assigned to the rank when there is one",
        True,
        TypeConverters.toBoolean,
    ),
    ("mp_start_method", "accepted for Horovod compatibility", None, None),
    (
        "backward_passes_per_step",
        "backward passes accumulated before each allreduce and optimizer step",
        1,
        TypeConverters.toInt,
    ),
]

_TORCH_PARAMS: List[Tuple[str, str, Any, Any]] = [
    (
        "input_shapes",
        "shapes the feature tensors are reshaped to (one per feature column, "
        "batch dimension included, e.g. [-1, 1, 28, 28])",
        None,
        None,
    ),
    (
        "loss_constructors",
        "functions returning loss functions (for losses that cannot be pickled)",
        None,
        None,
    ),
    (
        "train_minibatch_fn",
        "fn(model, optimizer, transform_outputs, loss_fn, inputs, "
        "labels, sample_weights) -> (outputs, loss), replacing the default step",
        None,
        None,
    ),
]

_MODEL_PARAMS: List[Tuple[str, str, Any, Any]] = [
    ("history", "per-epoch metrics of the training run", None, None),
    ("model", "the trained model", None, None),
    ("feature_columns", "feature column names", None, TypeConverters.toListString),
    ("label_columns", "label column names", None, TypeConverters.toListString),
    (
        "output_cols",
        "output column names (default: <label>__output)",
        None,
        TypeConverters.toListString,
    ),
    ("run_id", "id of the training run", None, None),
    ("metadata", "dataset metadata: column dtypes and shapes, output shapes", None, None),
    ("input_shapes", "shapes the feature tensors are reshaped to", None, None),
    (
        "use_gpu",
        "predict on the GPU assigned to the Spark task when there is one",
        True,
        TypeConverters.toBoolean,
    ),
    ("inference_batch_size", "rows per model call in transform", 1024, TypeConverters.toInt),
]


class EstimatorParams(Params):
    """Horovod's estimator parameters (``horovod.spark.common.params.EstimatorParams``)."""


class TorchEstimatorParams(EstimatorParams):
    """:class:`EstimatorParams` plus the PyTorch ones (``input_shapes``,
    ``loss_constructors``, ``train_minibatch_fn``)."""


class ModelParams(Params):
    """Horovod's model parameters (``horovod.spark.common.params.ModelParams``)."""


_ESTIMATOR_DEFAULTS = _declare(EstimatorParams, _ESTIMATOR_PARAMS)
_TORCH_DEFAULTS = _declare(TorchEstimatorParams, _TORCH_PARAMS)
_MODEL_DEFAULTS = _declare(ModelParams, _MODEL_PARAMS)


def estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`EstimatorParams` (for ``_setDefault``)."""
    return dict(_ESTIMATOR_DEFAULTS)


def torch_estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`TorchEstimatorParams`."""
    return {**_ESTIMATOR_DEFAULTS, **_TORCH_DEFAULTS}


def model_defaults() -> Dict[str, Any]:
    """Defaults of :class:`ModelParams`."""
    return dict(_MODEL_DEFAULTS)
