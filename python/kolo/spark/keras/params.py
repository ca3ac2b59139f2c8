"""The Spark ML parameters of :class:`~kolo.spark.keras.KerasEstimator` and
:class:`~kolo.spark.keras.KerasModel`: the shared ones (:mod:`kolo.spark.common.params`) plus
Horovod's Keras ones, ``custom_objects``, ``checkpoint_callback`` and ``backend_env``.

Example::

    from kolo.spark.keras import KerasEstimator

    est = KerasEstimator(custom_objects={"MyLayer": MyLayer})
    est.getCustomObjects()
"""

from __future__ import annotations

from typing import Any, Dict, List

from kolo.spark.common.params import (
    EstimatorParams,
    ModelParams,
    _declare,
    estimator_defaults,
    model_defaults,
)
from kolo.spark.common.training_params import ParamSpec

__all__ = [
    "KerasEstimatorParams",
    "KerasModelParams",
    "keras_estimator_defaults",
    "keras_model_defaults",
]

_CUSTOM_OBJECTS: ParamSpec = (
    "custom_objects",
    "dict of name -> custom Keras class or function the model, loss or metrics need to load",
    None,
    None,
)

KERAS_PARAMS: List[ParamSpec] = [
    _CUSTOM_OBJECTS,
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


class KerasEstimatorParams(EstimatorParams):
    """:class:`EstimatorParams` plus the Keras ones."""


class KerasModelParams(ModelParams):
    """:class:`ModelParams` plus ``custom_objects``."""


_KERAS_DEFAULTS = _declare(KerasEstimatorParams, KERAS_PARAMS)
_KERAS_MODEL_DEFAULTS = _declare(KerasModelParams, [_CUSTOM_OBJECTS])


def keras_estimator_defaults() -> Dict[str, Any]:
    """Defaults of :class:`KerasEstimatorParams`."""
    return {**estimator_defaults(), **_KERAS_DEFAULTS}


def keras_model_defaults() -> Dict[str, Any]:
    """Defaults of :class:`KerasModelParams`."""
    return {**model_defaults(), **_KERAS_MODEL_DEFAULTS}
