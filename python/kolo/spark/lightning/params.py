"""The Spark ML parameters of :class:`kolo.spark.lightning.TorchEstimator`: every
:class:`~kolo.spark.common.params.EstimatorParams` one plus Horovod's Lightning ones
(``trainer_args``, ``logger``, ``log_every_n_steps``, ``terminate_on_nan``, ``profiler``,
``num_gpus``) and ``input_shapes``.

Example::

    from kolo.spark.lightning import TorchEstimator

    est = TorchEstimator(trainer_args={"gradient_clip_val": 1.0}, log_every_n_steps=10)
    assert est.getLogEveryNSteps() == 10
"""

from __future__ import annotations

from typing import Any, Dict, List

from kolo.spark.common.params import EstimatorParams, _declare, estimator_defaults
from kolo.spark.common.training_params import ParamSpec

__all__ = ["LIGHTNING_PARAMS", "LightningEstimatorParams", "lightning_estimator_defaults"]

#: The Lightning estimator's own parameters.
LIGHTNING_PARAMS: List[ParamSpec] = [
    (
        "input_shapes",
        "shapes the feature tensors are reshaped to (one per feature column, "
        "batch dimension included, e.g. [-1, 1, 28, 28])",
        None,
        None,
    ),
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
        "num_gpus",
        "GPUs per training process: 0 trains on the CPU; default: one when use_gpu and CUDA "
        "is available",
        None,
        None,
    ),
]


class LightningEstimatorParams(EstimatorParams):
    """:class:`~kolo.spark.common.params.EstimatorParams` plus :data:`LIGHTNING_PARAMS`."""


_LIGHTNING_DEFAULTS = _declare(LightningEstimatorParams, LIGHTNING_PARAMS)


def lightning_estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`LightningEstimatorParams`.

    Example::

        assert lightning_estimator_defaults()["log_every_n_steps"] == 50
    """
    return {**estimator_defaults(), **_LIGHTNING_DEFAULTS}
