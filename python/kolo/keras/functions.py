"""Whole-model helpers: Horovod's ``broadcast_variables`` and ``load_model`` for Keras 3."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import keras

from kolo import _core
from kolo.exceptions import NotSupportedError
from kolo.keras import _arrays, _bridge
from kolo.keras.compression import Compression
from kolo.keras.optimizer import distributed_class, make_settings
from kolo.process_sets import global_process_set, resolve

__all__ = ["broadcast_global_variables", "broadcast_variables", "load_model"]


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


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's Keras ``broadcast_global_variables``: always raises
    :class:`~kolo.exceptions.NotSupportedError` on Keras 3.

    Horovod's version broadcasts TensorFlow 1's global-variable collection and runs the result
    in the Keras session; under TensorFlow 2's eager execution (where Keras 3 runs) Horovod
    raises too. Keras 3 has neither global collections nor a session, so there is nothing this
    call could broadcast. Use ``hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)``
    with ``model.fit``, or ``hvd.broadcast_variables(model.variables, root_rank)`` (and
    ``model.optimizer.variables`` once the optimizer is built) in a custom loop.

    Example::

        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    """
    raise NotSupportedError(
        "hvd.broadcast_global_variables() is not supported on Keras 3: there are no global "
        "variable collections or Keras session to broadcast (Horovod raises too under "
        "TensorFlow 2's eager execution); use "
        f"hvd.callbacks.BroadcastGlobalVariablesCallback({int(root_rank)}) with model.fit, or "
        f"hvd.broadcast_variables(model.variables, root_rank={int(root_rank)}) in a custom "
        "training loop"
    )


def load_model(
    filepath: Any,
    custom_optimizers: Optional[list[type]] = None,
    custom_objects: Optional[dict[str, Any]] = None,
    compression: Any = Compression.none,
    legacy_opts: bool = False,
) -> keras.Model:
    """Loads a saved Keras model whose optimizer becomes a ``DistributedOptimizer`` again
    (with its saved state), ready to continue training.

    ``legacy_opts=True`` (Horovod: wrap ``keras.optimizers.legacy`` optimizers) raises
    :class:`~kolo.exceptions.NotSupportedError`: Keras 3 has no legacy optimizers.

    Example::

        model = hvd.load_model("checkpoint.keras")
        model.fit(x, y, initial_epoch=5, epochs=10)
    """
    if legacy_opts:
        raise NotSupportedError(
            "load_model(legacy_opts=True) wraps keras.optimizers.legacy optimizers, which Keras 3 "
            "does not have; save the model with a Keras 3 optimizer and pass legacy_opts=False"
        )
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
