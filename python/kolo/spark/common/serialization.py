"""Spark ML persistence of kolo estimators and models (Horovod's
``horovod.spark.common.serialization``): ``write().save(path)`` / ``Class.load(path)``.

Every parameter value (models, optimizers, stores, functions) is cloudpickled into
``<path>/params.pkl``; ``<path>/metadata.json`` says what was saved (class, uid, parameter
names, versions). Both are written through :class:`kolo.store.Store`, so ``path`` may be any
store location (local, ``s3://``, ``gs://``, ``hdfs://``, ``dbfs:/``...), written atomically.

Example::

    model.write().overwrite().save("s3://bucket/models/digits")
    same = TorchModel.load("s3://bucket/models/digits")
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Dict, Optional

import cloudpickle
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from kolo.exceptions import InvalidArgumentError, StoreError

__all__ = ["KoloPersistence", "KoloReader", "KoloWriter"]

log = logging.getLogger(__name__)

_FORMAT = 1


def _open(path: str, storage_options: Optional[Dict[str, Any]]) -> tuple:
    from kolo.store import Store

    store = Store.create(path, storage_options=storage_options)
    return store, store.prefix_path


class KoloWriter(MLWriter):
    """Saves a kolo estimator or model (all its set parameters) under a store path.

    ``option("storage_options", {...})`` is not a string option; pass store options with
    ``write().storage_options({...})``.

    Example::

        est.write().overwrite().save("/tmp/my_estimator")
    """

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance
        self._storage_options: Optional[Dict[str, Any]] = None

    def storage_options(self, options: Dict[str, Any]) -> KoloWriter:
        """Store options for ``save`` (credentials, endpoint)."""
        self._storage_options = dict(options)
        return self

    def save(self, path: str) -> None:
        """Saves to ``path``; an existing save there is replaced only after ``overwrite()``."""
        if not isinstance(path, str):
            raise InvalidArgumentError(f"path must be a string, not {type(path).__name__}")
        store, prefix = _open(path, self._storage_options)
        if store.exists(f"{prefix}/metadata.json"):
            if not self.shouldOverwrite:
                raise StoreError(
                    f"{prefix} already holds a saved instance: call write().overwrite().save()"
                    " to replace it, or pick another path"
                )
            store.delete(f"{prefix}/params.pkl")
        self.saveImpl(path)

    def saveImpl(self, path: str) -> None:
        """Writes ``params.pkl`` and ``metadata.json`` under ``path`` (Spark ML's hook)."""
        store, prefix = _open(path, self._storage_options)
        instance = self.instance
        values = {
            param.name: instance.getOrDefault(param)
            for param in instance.params
            if instance.isSet(param) or instance.hasDefault(param)
        }
        try:
            payload = cloudpickle.dumps({"uid": instance.uid, "params": values})
        except Exception as err:
            raise InvalidArgumentError(
                f"cannot save {type(instance).__name__}: a parameter cannot be pickled ({err})"
            ) from err
        metadata = {
            "class": f"{type(instance).__module__}.{type(instance).__qualname__}",
            "uid": instance.uid,
            "format": _FORMAT,
            "timestamp": int(time.time() * 1000),
            "params": sorted(values),
        }
        store.write_bytes(f"{prefix}/params.pkl", payload)
        store.write_text(f"{prefix}/metadata.json", json.dumps(metadata, indent=1))
        log.info("saved %s to %s", type(instance).__name__, prefix)


class KoloReader(MLReader):
    """Loads what :class:`KoloWriter` saved into a new instance of ``cls``.

    Example::

        est = TorchEstimator.read().load("/tmp/my_estimator")
    """

    def __init__(self, cls: type, storage_options: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self.cls = cls
        self._storage_options = storage_options

    def load(self, path: str) -> Any:
        """A new instance of the reader's class with the parameters saved under ``path``."""
        store, prefix = _open(path, self._storage_options)
        if not store.exists(f"{prefix}/metadata.json"):
            raise StoreError(f"nothing saved at {prefix}: no metadata.json there")
        metadata = json.loads(store.read_text(f"{prefix}/metadata.json"))
        expected = f"{self.cls.__module__}.{self.cls.__qualname__}"
        if metadata.get("class") != expected:
            raise InvalidArgumentError(
                f"{prefix} holds a {metadata.get('class')}, not a {expected}: load it with "
                "that class"
            )
        saved = cloudpickle.loads(store.read(f"{prefix}/params.pkl"))
        instance = self.cls()
        instance._resetUid(saved["uid"])
        instance._set(**{k: v for k, v in saved["params"].items() if instance.hasParam(k)})
        return instance


class KoloPersistence(MLReadable, MLWritable):
    """Spark ML persistence for kolo's estimators and models: ``write()`` gives a
    :class:`KoloWriter` (``write().overwrite().save(path)``), ``read()`` a :class:`KoloReader`
    (``Class.load(path)``). A class whose parameters need another form on disk sets
    ``_writer``/``_reader`` (the Keras ones save the model as a ``.keras`` archive).

    Example::

        est.write().overwrite().save("/tmp/my_estimator")
        est = TorchEstimator.read().load("/tmp/my_estimator")
    """

    #: Makes the writer of an instance.
    _writer: Callable[[Any], KoloWriter] = KoloWriter
    #: Makes the reader of a class.
    _reader: Callable[[type], KoloReader] = KoloReader

    def write(self) -> KoloWriter:
        """A writer that saves every parameter (``write().overwrite().save(path)``).

        Example::

            model.write().overwrite().save("/tmp/digits_model")
        """
        return type(self)._writer(self)

    @classmethod
    def read(cls) -> KoloReader:
        """A reader of what :meth:`write` saved (``read().load(path)``).

        Example::

            model = TorchModel.read().load("/tmp/digits_model")
        """
        return cls._reader(cls)
