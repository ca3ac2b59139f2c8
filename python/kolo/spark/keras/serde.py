"""Keras models as bytes inside Spark ML parameters: :class:`SavedKerasModel`, what
``KerasModel.save`` and ``transform`` ship (a ``.keras`` archive made by the estimator core's
:func:`~kolo.estimator.keras_trainer.model_to_bytes`). Importing this module imports neither
Keras nor PySpark.

Example::

    saved = SavedKerasModel(model_to_bytes(model))
    same = saved.load(custom_objects={"MyLayer": MyLayer})
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from kolo.estimator.keras_trainer import model_from_bytes

__all__ = ["SavedKerasModel"]


class SavedKerasModel:
    """A Keras model as ``.keras`` bytes inside a pickled parameter (what ``KerasModel.save``
    and ``transform`` ship), so unpickling it needs no custom objects; :meth:`load` rebuilds
    the model with them.

    Example::

        saved = SavedKerasModel(model_to_bytes(model))
        model = saved.load(custom_objects)
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def load(self, custom_objects: Optional[Dict[str, Any]] = None) -> Any:
        """The model, built with ``custom_objects``."""
        return model_from_bytes(self.data, custom_objects)

    def __getstate__(self) -> Dict[str, Any]:
        return {"data": self.data}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.data = state["data"]
