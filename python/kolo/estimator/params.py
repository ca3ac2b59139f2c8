"""The one table of the estimators' training parameters, for every framework and launcher:
the Spark estimators (:mod:`kolo.spark.common.params` declares each row as a Spark ML
``Param``) and :class:`kolo.ray.TorchEstimator` (keyword arguments). Names, docs and defaults
are Horovod's. Importing this module imports neither PySpark nor a framework.

Each row is ``(name, doc, default, converter)``, ``converter`` the name of a
``pyspark.ml.param.TypeConverters`` method or ``None``. :data:`TRAINING_PARAMS` apply to every
framework; :data:`TORCH_PARAMS`, :data:`LIGHTNING_PARAMS` and :data:`KERAS_PARAMS` are each
framework's own.

Example::

    from kolo.estimator.params import training_defaults

    assert training_defaults()["batch_size"] == 32
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from kolo.exceptions import InvalidArgumentError

__all__ = [
    "CUSTOM_OBJECTS_PARAM",
    "KERAS_PARAMS",
    "LIGHTNING_PARAMS",
    "NO_EFFECT",
    "TORCH_PARAMS",
    "TRAINING_PARAMS",
    "NoEffectWarning",
    "ParamSpec",
    "reject_unknown",
    "training_defaults",
    "warn_no_effect",
]

#: ``(name, doc, default, converter)``.
ParamSpec = Tuple[str, str, Any, Optional[str]]

#: What every estimator takes to train, whatever the framework and the launcher.
TRAINING_PARAMS: List[ParamSpec] = [
    ("store", "kolo.store.Store holding the prepared data, checkpoints and logs", None, None),
    ("model", "the model to train", None, None),
    ("optimizer", "the optimizer, built on the model's parameters", None, None),
    ("loss", "the loss function, or a list of them (one per label column)", None, None),
    ("loss_weights", "weights of the losses of several label columns", None, None),
    ("sample_weight_col", "column of per-row loss weights", None, None),
    ("metrics", "metric functions metric(output, label) -> tensor", None, None),
    ("feature_cols", "feature column names", None, "toListString"),
    ("label_cols", "label column names", None, "toListString"),
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
    ("batch_size", "rows per batch and rank", 32, "toInt"),
    ("val_batch_size", "rows per validation batch and rank (default: batch_size)", None, None),
    ("epochs", "number of epochs", 1, "toInt"),
    (
        "verbose",
        "0: quiet, 1: progress bar per epoch, 2: per-rank step logs",
        1,
        "toInt",
    ),
    (
        "random_seed",
        "seed of the model initialisation, the validation split and the shuffle",
        None,
        None,
    ),
    ("shuffle", "shuffle the training rows every epoch", True, "toBoolean"),
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
        "toInt",
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
    ("train_reader_num_workers", "decode threads of the training loader", 2, "toInt"),
    ("val_reader_num_workers", "decode threads of the validation loader", 2, "toInt"),
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
        "backward_passes_per_step",
        "backward passes accumulated before each allreduce and optimizer step",
        1,
        "toInt",
    ),
    (
        "continuous_cols",
        "continuous feature column names, given to a custom data_module (continuous_cols=)",
        None,
        "toListString",
    ),
    (
        "categorical_cols",
        "categorical feature column names, given to a custom data_module (categorical_cols=)",
        None,
        "toListString",
    ),
    (
        "transformation_edit_fields",
        "(name, numpy_dtype, shape, is_nullable) of fields transformation_fn adds or changes: "
        "each is cast to numpy_dtype and reshaped to [-1, *shape] after the transformation",
        None,
        None,
    ),
    (
        "transformation_removed_fields",
        "names of fields removed from every batch after transformation_fn",
        None,
        None,
    ),
    (
        "data_module",
        "a data module class replacing kolo's Parquet loader: built in every rank with "
        "Horovod's data module keyword arguments (train_dir, val_dir, cur_shard, "
        "shard_count, ...)",
        None,
        None,
    ),
    (
        "reader_pool_type",
        "'thread' or 'process': the loader decodes on train/val_reader_num_workers threads; "
        "'dummy': on one thread",
        "thread",
        None,
    ),
    (
        "inmemory_cache_all",
        "keep the rank's decoded rows in memory after the first epoch and read later epochs "
        "from there (reshuffled every epoch when shuffle)",
        False,
        "toBoolean",
    ),
    (
        "mp_start_method",
        "multiprocessing start method ('fork', 'spawn', 'forkserver') set in every rank "
        "before training",
        None,
        None,
    ),
    (
        "debug_data_loader",
        "log the loader's settings and, for every batch, its shapes and the wait for it",
        False,
        "toBoolean",
    ),
    (
        "train_async_data_loader_queue_size",
        "training batches the loader keeps ready ahead (default: 2)",
        None,
        None,
    ),
    (
        "val_async_data_loader_queue_size",
        "validation batches the loader keeps ready ahead (default: 2)",
        None,
        None,
    ),
]

_INPUT_SHAPES: ParamSpec = (
    "input_shapes",
    "shapes the feature tensors are reshaped to (one per feature column, "
    "batch dimension included, e.g. [-1, 1, 28, 28])",
    None,
    None,
)

#: The PyTorch estimators' own.
TORCH_PARAMS: List[ParamSpec] = [
    _INPUT_SHAPES,
    (
        "loss_constructors",
        "functions returning loss functions (for losses that cannot be pickled)",
        None,
        None,
    ),
    (
        "train_minibatch_fn",
        "fn(model, optimizer, transform_outputs, loss_fn, inputs, labels, sample_weights, "
        "backward_passes_per_step, batch_idx) -> (outputs, loss), replacing Horovod's "
        "minibatch step (zero_grad, forward, loss, backward, step); the optimizer steps once "
        "more after each epoch, as in Horovod",
        None,
        None,
    ),
]


#: The Lightning estimator's own (Horovod's ``horovod.spark.lightning`` ones, and
#: ``input_shapes``).
LIGHTNING_PARAMS: List[ParamSpec] = [
    _INPUT_SHAPES,
    (
        "trainer_args",
        "more keyword arguments of lightning.pytorch.Trainer (e.g. gradient_clip_val, "
        "precision); strategy, devices and max_epochs are set by the estimator",
        None,
        None,
    ),
    (
        "logger",
        "a Lightning logger (default: TensorBoard event logs under the run's logs/ in the store; "
        "False: none)",
        None,
        None,
    ),
    ("log_every_n_steps", "Trainer(log_every_n_steps=...)", 50, "toInt"),
    (
        "terminate_on_nan",
        "stop training with a DataError when the training loss becomes NaN or infinite",
        False,
        "toBoolean",
    ),
    ("profiler", "Trainer(profiler=...): a Lightning profiler or its name", None, None),
    (
        "loader_num_epochs",
        "passes of the reader over the data, given to a custom data_module as "
        "num_reader_epochs (default None: endless)",
        None,
        None,
    ),
    (
        "loss_constructors",
        "functions returning the losses of a plain torch.nn.Module (not for a "
        "LightningModule, which computes its loss)",
        None,
        None,
    ),
    (
        "train_minibatch_fn",
        "not for a LightningModule, whose training_step() is the minibatch step",
        None,
        None,
    ),
    (
        "num_gpus",
        "GPUs per training process: 0 trains on the CPU; default: one when use_gpu and CUDA "
        "is available",
        None,
        None,
    ),
]

#: What a Keras model needs to load; an estimator and a trained model parameter alike.
CUSTOM_OBJECTS_PARAM: ParamSpec = (
    "custom_objects",
    "dict of name -> custom Keras class or function the model, loss or metrics need to load",
    None,
    None,
)

#: The Keras estimator's own.
KERAS_PARAMS: List[ParamSpec] = [
    CUSTOM_OBJECTS_PARAM,
    (
        "checkpoint_callback",
        "a kolo.keras.callbacks.BestModelCheckpoint (or keras ModelCheckpoint) whose file "
        "becomes the returned model (the best epoch); default: the last epoch's model",
        None,
        None,
    ),
    (
        "backend_env",
        "environment variables set in every rank before Keras is imported, e.g. "
        '{"KERAS_BACKEND": "torch"}',
        None,
        None,
    ),
]


#: The parameters kolo accepts with Horovod's name but that have no meaning in kolo: name →
#: why (one line). Setting one to anything but its default warns once per process
#: (:func:`warn_no_effect`); every other parameter has Horovod's effect.
NO_EFFECT: Dict[str, str] = {
    "compress_sparse_cols": (
        "kolo writes Spark sparse vectors as dense arrays, which its loader reads without "
        "decoding; there is no sparse encoding to compress"
    ),
    "loader_num_epochs": (
        "kolo's loader always reads on into the next pass, as Horovod's default (None) does; "
        "the value only reaches a custom data_module (as num_reader_epochs)"
    ),
}


class NoEffectWarning(UserWarning):
    """Warned once per process for a parameter of :data:`NO_EFFECT` set to a value other than
    its default.

    Example::

        warnings.simplefilter("error", NoEffectWarning)   # make them errors
    """


_WARNED: Set[str] = set()


def warn_no_effect(owner: str, values: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """Warns (:class:`NoEffectWarning`, once per process and parameter) for each parameter
    of :data:`NO_EFFECT` in ``values`` set to something other than its default, naming it
    and why it has no effect.

    Example::

        warn_no_effect("TorchEstimator", {"compress_sparse_cols": True}, {})
    """
    for name, value in values.items():
        if name in NO_EFFECT and name not in _WARNED and value != defaults.get(name):
            _WARNED.add(name)
            warnings.warn(
                f"{owner}: {name}={value!r} has no effect in kolo: {NO_EFFECT[name]}",
                NoEffectWarning,
                stacklevel=3,
            )


def training_defaults() -> Dict[str, Any]:
    """The defaults of :data:`TRAINING_PARAMS` and :data:`TORCH_PARAMS`, by name.

    Example::

        assert training_defaults()["shuffle"] is True
    """
    return {name: default for name, _, default, _ in (*TRAINING_PARAMS, *TORCH_PARAMS)}


def reject_unknown(owner: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Raises :class:`~kolo.exceptions.InvalidArgumentError` naming the ``given`` parameter
    names that are not ``known`` (and listing the known ones).

    Example::

        reject_unknown("TorchEstimator", kwargs, training_defaults())
    """
    known = set(known)
    unknown = sorted(k for k in given if k not in known)
    if unknown:
        raise InvalidArgumentError(
            f"{owner} has no parameter {', '.join(unknown)}; its parameters are: "
            f"{', '.join(sorted(known))}"
        )
