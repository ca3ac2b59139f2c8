"""Spark ML persistence of :class:`~kolo.spark.keras.KerasEstimator` and
:class:`~kolo.spark.keras.KerasModel`: the shared ``KoloWriter`` and ``KoloReader``
(:mod:`kolo.spark.common.serialization`), with the Keras model saved as a
``.keras`` archive (a pickled Keras model could not be loaded without its custom objects) and
rebuilt with the instance's ``custom_objects`` on load.

Example::

    keras_model.write().overwrite().save("/tmp/digits_keras")
    same = KerasModel.load("/tmp/digits_keras")
"""

from __future__ import annotations

from typing import Any

from kolo.estimator.keras_trainer import model_to_bytes
from kolo.spark.common.serialization import KoloReader, KoloWriter
from kolo.spark.keras.serde import SavedKerasModel

__all__ = ["KerasReader", "keras_writer"]


def keras_writer(instance: Any) -> KoloWriter:
    """A writer of a copy of ``instance`` whose ``model`` parameter is ``.keras`` bytes.

    Example::

        keras_writer(estimator).overwrite().save("/tmp/estimator")
    """
    portable = instance.copy()
    model = instance.getOrDefault(instance.model)
    if model is not None and not isinstance(model, SavedKerasModel):
        portable._set(model=SavedKerasModel(model_to_bytes(model)))
    return KoloWriter(portable)


class KerasReader(KoloReader):
    """Loads what :func:`keras_writer` saved, rebuilding the Keras model with the saved
    ``custom_objects``.

    Example::

        model = KerasReader(KerasModel).load("/tmp/digits_keras")
    """

    def load(self, path: str) -> Any:
        """The instance saved under ``path``, its Keras model rebuilt with ``custom_objects``."""
        instance = super().load(path)
        saved = instance.getOrDefault(instance.model)
        if isinstance(saved, SavedKerasModel):
            instance._set(model=saved.load(instance.getOrDefault(instance.custom_objects)))
        return instance
