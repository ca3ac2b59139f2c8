"""Whole-model helpers: Horovod's ``broadcast_variables`` and ``load_model`` for Keras 3."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import keras

from kolo import _core
from kolo.keras import _arrays, _bridge
from kolo.keras.compression import Compression
from kolo.keras.optimizer import distributed_class, make_settings
from kolo.process_sets import global_process_set, resolve

__all__ = ["broadcast_variables", "load_model"]


def broadcast_variables(
    variables: Iterable[Any], root_rank: int, process_set: Any = global_process_set
) -> None:
    """Assigns ``root_rank``'s values to ``variables`` on every rank (in one fused broadcast).

    Every rank must pass the same variables in the same order (e.g. ``model.variables``).

    Example::

        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(model.optimizer.variables, root_rank=0)
    """
    _core.require_initialized()
    variables = list(variables)
    if not variables:
        return
    ps = resolve(process_set)
    base = _core.op_name("broadcast_variables", None)
    names = [f"{base}.{i}" for i in range(len(variables))]
    if _bridge.in_tf_graph():
        values = _bridge.call(
            lambda arrays: _arrays.broadcast(arrays, root_rank, names, ps),
            variables,
            name="kolo_broadcast_variables",
        )
        for var, value in zip(variables, values):
            var.assign(value)
        return
    arrays = _arrays.broadcast([_bridge.to_numpy(v) for v in variables], root_rank, names, ps)
    if _core.rank() == int(root_rank):
        return
    for var, value in zip(variables, arrays):
        var.assign(value)


def load_model(
    filepath: Any,
    custom_optimizers: Optional[list[type]] = None,
    custom_objects: Optional[dict[str, Any]] = None,
    compression: Any = Compression.none,
) -> keras.Model:
    """Loads a saved Keras model whose optimizer becomes a ``DistributedOptimizer`` again
    (with its saved state), ready to continue training.

    Example::

        model = hvd.load_model("checkpoint.keras")
        model.fit(x, y, initial_epoch=5, epochs=10)
    """
    candidates: dict[str, type] = {}
    for name in dir(keras.optimizers):
        cls = getattr(keras.optimizers, name)
        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer):
            candidates[cls.__name__] = cls
    for cls in custom_optimizers or []:
        candidates[cls.__name__] = cls
    settings = make_settings(None, compression, False, None, 1.0, 1.0, None, global_process_set)
    objects = {name: distributed_class(cls, settings) for name, cls in candidates.items()}
    objects.update(custom_objects or {})
    return keras.saving.load_model(filepath, custom_objects=objects)
