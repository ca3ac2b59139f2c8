"""Keras models and training objects as bytes, for the trip to the ranks, the checkpoints,
the Spark workers that run ``transform`` and ``KerasModel.save``.

A model travels as a ``.keras`` archive (architecture, weights and optimizer state; the same
on every Keras backend), loaded with the estimator's ``custom_objects``. The other user objects
(losses, metrics, callbacks, custom objects) travel cloudpickled and are only unpickled after
the rank has set its environment (``backend_env``, e.g. ``KERAS_BACKEND``), because unpickling
them imports Keras. Importing this module imports neither Keras nor PySpark.

Example::

    data = model_to_bytes(model)
    same = model_from_bytes(data, custom_objects={"MyLayer": MyLayer})
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

__all__ = ["SavedKerasModel", "model_from_bytes", "model_to_bytes"]


def model_to_bytes(model: Any) -> bytes:
    """``model`` as the bytes of a ``.keras`` archive (with its optimizer's state when
    compiled).

    Example::

        data = model_to_bytes(model)
    """
    with tempfile.TemporaryDirectory(prefix="kolo-keras-") as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(
    data: bytes, custom_objects: Optional[Dict[str, Any]] = None, compile: bool = False
) -> Any:
    """The model saved by :func:`model_to_bytes` (``compile=True`` also restores its optimizer,
    loss and metrics).

    Example::

        model = model_from_bytes(data, custom_objects=None)
    """
    import kolo.keras  # noqa: F401 - loads triton before TensorFlow (kolo.keras._preload)

    # isort: split
    import keras

    with tempfile.TemporaryDirectory(prefix="kolo-keras-") as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, custom_objects=custom_objects, compile=compile)


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
