"""Horovod's Keras ``DistributedOptimizer`` for Keras 3 (TensorFlow and torch backends).

The wrapped optimizer is an instance of a subclass of the original's class, made from its
config. Keras 3 computes the gradients, unscales them (mixed precision) and, when gradient
accumulation is on, averages the accumulated ones; right before clipping, weight decay and the
update, the subclass averages the gradients over all ranks. So clipping sees the global
gradient, as in single-process training on the combined batch, and ``backward_passes_per_step``
maps onto Keras's own ``gradient_accumulation_steps`` (one allreduce per update, not per pass).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Optional

import keras
import numpy as np

from kolo import _core
from kolo._core import Adasum, Average, ReduceOp, resolve_op
from kolo._env import elastic_launch
from kolo.exceptions import ConfigError, InvalidArgumentError, InvalidValueError
from kolo.keras import _arrays, _bridge
from kolo.keras.compression import Compression
from kolo.process_sets import ProcessSet, global_process_set, resolve

__all__ = [
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "distributed_class",
    "is_distributed",
    "make_settings",
]


class _Settings:
    """What a distributed optimizer class does to gradients (shared by its instances)."""

    def __init__(
        self,
        prefix: str,
        compression: Any,
        sparse_as_dense: bool,
        op: ReduceOp,
        prescale: float,
        postscale: float,
        groups: Any,
        process_set: Any,
        scale_local_gradients: bool = True,
    ) -> None:
        self.prefix = prefix
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.prescale = prescale
        self.postscale = postscale
        self.groups = groups
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients


class _DistributedOptimizerMixin:
    """Averages the gradients over all ranks just before Keras clips and applies them, except
    those of the variables registered with :meth:`register_local_var` (kept on each rank)."""

    _kolo: _Settings
    _kolo_variables: Optional[list[Any]] = None
    _kolo_local_vars: tuple[Any, ...] = ()

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient out of the allreduce: each rank applies its own (divided
        by the number of ranks when ``scale_local_gradients`` is on), as Horovod's.

        Example::

            for var in model.layers[-1].trainable_weights:
                opt.register_local_var(var)
        """
        if not any(v is var for v in self._kolo_local_vars):
            # Bypasses Keras's tracking: these are the model's variables, not optimizer state.
            object.__setattr__(self, "_kolo_local_vars", (*self._kolo_local_vars, var))

    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> Any:
        # Bypasses Keras's tracking: these are the model's variables, not optimizer state.
        object.__setattr__(self, "_kolo_variables", list(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)  # type: ignore[misc]

    def _clip_gradients(self, grads: Any) -> Any:
        grads = _reduce_with_locals(
            self._kolo, list(grads), self._kolo_variables, self._kolo_local_vars
        )
        return super()._clip_gradients(grads)  # type: ignore[misc]


def _reduce_with_locals(
    settings: _Settings, grads: list[Any], variables: Optional[list[Any]], local_vars: Any
) -> list[Any]:
    """Reduces the gradients of the shared variables; the local variables' gradients stay on
    this rank, scaled as the reduced ones are (accumulation, predivide) and, with
    ``scale_local_gradients``, divided by the process set's size, as Horovod's."""
    if not local_vars:
        return _reduce_gradients(settings, grads, variables)
    if variables is None or len(variables) != len(grads):
        raise ConfigError(
            "local variables (PartialDistributedOptimizer / register_local_var) need the "
            "trainable variables; apply gradients through optimizer.apply(grads, variables)"
        )
    local_ids = {id(v) for v in local_vars}
    shared = [i for i, v in enumerate(variables) if id(v) not in local_ids]
    out = list(grads)
    reduced = _reduce_gradients(
        settings, [grads[i] for i in shared], [variables[i] for i in shared]
    )
    for i, r in zip(shared, reduced):
        out[i] = r
    scale = settings.prescale * settings.postscale
    if settings.scale_local_gradients:
        scale /= _set_size(settings.process_set)
    for i, var in enumerate(variables):
        if id(var) in local_ids and grads[i] is not None and scale != 1.0:
            out[i] = _scaled(grads[i], scale)
    return out


def _set_size(process_set: Any) -> int:
    ps = resolve(process_set)
    return len(ps.ranks) if ps.ranks is not None else _core.size()


def _scaled(grad: Any, scale: float) -> Any:
    if _is_sparse(grad):
        tf = _bridge._tf()
        return tf.IndexedSlices(
            grad.values * tf.cast(scale, grad.values.dtype), grad.indices, grad.dense_shape
        )
    return grad * scale


def _grad_names(settings: _Settings, variables: Optional[list[Any]], count: int) -> list[str]:
    paths = [getattr(v, "path", None) for v in variables or []]
    if len(paths) != count or None in paths or len(set(paths)) != count:
        return [f"{settings.prefix}.grad.{i}" for i in range(count)]
    return [f"{settings.prefix}.{i}.{p}" for i, p in enumerate(paths)]


def _split_groups(
    settings: _Settings, variables: Optional[list[Any]], count: int
) -> list[list[int]]:
    """Indices of the gradients reduced together, one list per group (one group by default)."""
    groups = settings.groups
    if groups is None:
        return [list(range(count))]
    if isinstance(groups, int):
        size = -(-count // groups)
        return [list(range(i, min(i + size, count))) for i in range(0, count, size)]
    if variables is None or len(variables) != count:
        raise ConfigError("groups= given as lists of variables needs the trainable variables")
    position = {id(v): i for i, v in enumerate(variables)}
    chosen: list[list[int]] = []
    for group in groups:
        indices = [position[id(v)] for v in group if id(v) in position]
        if indices:
            chosen.append(indices)
    grouped = {i for g in chosen for i in g}
    rest = [i for i in range(count) if i not in grouped]
    return chosen + ([rest] if rest else [])


def _is_sparse(grad: Any) -> bool:
    if _bridge.backend() != "tensorflow":
        return False
    return isinstance(grad, _bridge._tf().IndexedSlices)


def _reduce_dense(settings: _Settings, grads: list[Any], names: list[str]) -> list[Any]:
    ps = resolve(settings.process_set)
    compression = settings.compression

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        packed = [compression.compress(a) for a in arrays]
        reduced = _arrays.allreduce(
            [p for p, _ in packed], names, settings.op, settings.prescale, settings.postscale, ps
        )
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed)]

    return _bridge.call(run, grads, name="kolo_allreduce_gradients")


def _reduce_sparse(settings: _Settings, grad: Any, name: str) -> Any:
    """An ``IndexedSlices`` gradient, gathered (Horovod's sparse allreduce): every rank's rows
    and indices concatenated, the values scaled as the dense reduction would scale them."""
    tf = _bridge._tf()
    ps = resolve(settings.process_set)
    names = [f"{name}.values", f"{name}.indices"]
    scale = settings.prescale * settings.postscale
    if settings.op == Average:
        scale /= len(ps.ranks)
    elif settings.op != _core.Sum:
        raise InvalidArgumentError(
            f"sparse gradients can only be averaged or summed, not {settings.op.name}-reduced; "
            "pass sparse_as_dense=True"
        )

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        values, indices = _arrays.allgather(arrays, names, ps)
        return [values * np.asarray(scale, dtype=values.dtype), indices]

    values, indices = _bridge.call(
        run,
        [grad.values, grad.indices],
        out_shapes=[[None, *grad.values.shape[1:]], [None]],
        name="kolo_allgather_sparse_gradient",
    )
    return tf.IndexedSlices(values, indices, grad.dense_shape)


def _reduce_gradients(
    settings: _Settings, grads: list[Any], variables: Optional[list[Any]]
) -> list[Any]:
    if not grads:
        return grads
    # One rank has nothing to average, but an elastic job's step must keep its allreduce:
    # ranks may join while the traced step runs on (Horovod's Keras uses the live size then).
    alone = _core.size() == 1 and not elastic_launch()
    if alone and settings.process_set in (None, global_process_set):
        scale = settings.prescale * settings.postscale
        return grads if scale == 1.0 else [g * scale for g in grads]
    names = _grad_names(settings, variables, len(grads))
    out = list(grads)
    sparse = [i for i, g in enumerate(grads) if _is_sparse(g)]
    if settings.sparse_as_dense:
        for i in sparse:
            out[i] = _bridge._tf().convert_to_tensor(grads[i])
        sparse = []
    for i in sparse:
        out[i] = _reduce_sparse(settings, grads[i], names[i])
    for group in _split_groups(settings, variables, len(grads)):
        dense = [i for i in group if i not in sparse]
        if dense:
            reduced = _reduce_dense(settings, [out[i] for i in dense], [names[i] for i in dense])
            for i, r in zip(dense, reduced):
                out[i] = r
    return out


def _validate(
    optimizer: Any,
    op: ReduceOp,
    gradient_predivide_factor: float,
    backward_passes_per_step: Any,
    groups: Any,
    process_set: Any,
) -> None:
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise InvalidValueError(
            "DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.Optimizer), got "
            f"{type(optimizer).__name__}; for torch.optim use kolo.torch.DistributedOptimizer"
        )
    if isinstance(optimizer, _DistributedOptimizerMixin):
        raise InvalidValueError("this optimizer is already a DistributedOptimizer; wrap it once")
    if _bridge.backend() not in ("tensorflow", "torch"):
        raise ConfigError(
            f"kolo.keras.DistributedOptimizer supports the tensorflow and torch Keras backends, "
            f"not {_bridge.backend()!r}; set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"
        )
    if gradient_predivide_factor != 1.0 and op != Average:
        raise InvalidValueError("gradient_predivide_factor is only supported with op=hvd.Average")
    if gradient_predivide_factor <= 0:
        raise InvalidValueError(
            f"gradient_predivide_factor must be positive, got {gradient_predivide_factor}"
        )
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int):
        raise InvalidValueError(
            f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}"
        )
    if backward_passes_per_step < 1:
        raise InvalidValueError(
            f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}"
        )
    if backward_passes_per_step > 1 and optimizer.gradient_accumulation_steps:
        raise InvalidValueError(
            "the optimizer already accumulates gradients (gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}); pass backward_passes_per_step=1 or drop "
            "gradient_accumulation_steps, not both"
        )
    if groups is not None and not isinstance(groups, (int, Sequence)):
        raise InvalidValueError(
            f"groups must be an int or a list of lists of variables, got {type(groups).__name__}"
        )
    if isinstance(groups, int) and groups <= 0:
        raise InvalidValueError(f"groups as an int must be positive, got {groups}")
    if process_set is not None and not isinstance(process_set, ProcessSet):
        raise InvalidValueError(
            f"process_set must be a kolo.ProcessSet, got {type(process_set).__name__}"
        )


def distributed_class(base: type, settings: _Settings) -> type:
    """A subclass of the Keras optimizer class ``base`` that reduces gradients as ``settings``
    say. It keeps ``base``'s name and module, so a saved model names ``base`` and loads with
    plain ``keras.saving.load_model`` too (``kolo.keras.load_model`` wraps it again).

    Example::

        settings = make_settings(None, Compression.none, False, None, 1.0, 1.0, None, None)
        DistributedSGD = distributed_class(keras.optimizers.SGD, settings)
        opt = DistributedSGD(learning_rate=0.1)
    """
    cls = type(base.__name__, (_DistributedOptimizerMixin, base), {"_kolo": settings})
    cls.__module__ = base.__module__
    cls.__qualname__ = base.__qualname__
    return cls


def make_settings(
    name: Optional[str],
    compression: Any,
    sparse_as_dense: bool,
    op: Any,
    gradient_predivide_factor: float,
    accumulation_postscale: float,
    groups: Any,
    process_set: Any,
) -> _Settings:
    """The reduction settings of a distributed optimizer class (see ``DistributedOptimizer``;
    ``accumulation_postscale`` multiplies the reduced gradients, ``op=None`` is Average).

    Example::

        settings = make_settings("opt", Compression.fp16, False, Sum, 1.0, 1.0, None, None)
    """
    reduce_op = resolve_op(op, None)
    prescale, postscale = 1.0, accumulation_postscale
    if reduce_op == Average and gradient_predivide_factor != 1.0:
        prescale = 1.0 / gradient_predivide_factor
        postscale *= gradient_predivide_factor
    return _Settings(
        name or "DistributedOptimizer",
        compression,
        bool(sparse_as_dense),
        reduce_op,
        prescale,
        postscale,
        groups,
        process_set,
    )


def DistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Wraps a Keras 3 optimizer so every update applies gradients averaged over all ranks.

    Works with ``model.fit`` (also when Keras compiles the train step with ``tf.function``) and
    with custom training loops, on the TensorFlow and torch backends.

    Args:
        optimizer: the ``keras.optimizers.Optimizer`` to wrap (not yet used for training).
        name: prefix of the collectives' names (default ``"DistributedOptimizer"``).
        device_dense: accepted for Horovod compatibility; kolo reduces host copies of the
            gradients.
        device_sparse: accepted for Horovod compatibility, like ``device_dense``.
        compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16`` on the wire.
        sparse_as_dense: reduce ``tf.IndexedSlices`` gradients (embeddings) densely instead of
            gathering their rows.
        gradient_predivide_factor: with Average, scale by ``1 / factor`` before the sum and by
            ``factor / size`` after it.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum`` (power-of-two rank
            counts; the gradients are Adasum-combined, as in Horovod).
        backward_passes_per_step: batches whose gradients are accumulated locally before one
            allreduce and update (Keras's ``gradient_accumulation_steps``).
        average_aggregated_gradients: with ``backward_passes_per_step > 1``, apply the mean of
            the accumulated gradients; otherwise (Horovod's default) their sum.
        num_groups: deprecated alias of an integer ``groups``.
        groups: an int (split the gradients into that many fused groups) or lists of variables.
        process_set: reduce over this ``kolo.ProcessSet`` only.
        scale_local_gradients: divide the gradients of variables registered with
            ``opt.register_local_var(var)`` (not reduced) by the number of ranks.

    Example::

        import keras
        import kolo.keras as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9))
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
        model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    """
    del device_dense, device_sparse  # host staging; nothing to place
    reduce_op = resolve_op(op, None)  # InvalidArgumentError for unknown ops
    if not isinstance(scale_local_gradients, bool):
        raise InvalidValueError(
            f"scale_local_gradients must be True or False, got {scale_local_gradients!r}"
        )
    if reduce_op is Adasum:
        # As Horovod's Keras optimizer: the gradients are Adasum-combined (no delta step).
        if average_aggregated_gradients:
            raise InvalidValueError(
                "Adasum does not support average_aggregated_gradients == True (as in Horovod): "
                "pass average_aggregated_gradients=False, or use op=hvd.Average"
            )
        if _core.is_initialized():
            _core.check_adasum(resolve(process_set).size() or _core.size())
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    _validate(
        optimizer,
        reduce_op,
        gradient_predivide_factor,
        backward_passes_per_step,
        groups,
        process_set,
    )
    if optimizer.built:
        raise InvalidValueError(
            "wrap the optimizer before it is used: DistributedOptimizer builds a new optimizer "
            "from its config, and this one already has state (its variables are built)"
        )
    config = optimizer.get_config()
    accumulation_postscale = 1.0
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = backward_passes_per_step
        if not average_aggregated_gradients:
            # Keras averages the accumulated gradients; Horovod's default applies their sum.
            accumulation_postscale = float(backward_passes_per_step)
    settings = make_settings(
        name,
        compression,
        sparse_as_dense,
        reduce_op,
        float(gradient_predivide_factor),
        accumulation_postscale,
        groups,
        process_set,
    )
    settings.scale_local_gradients = scale_local_gradients
    return distributed_class(type(optimizer), settings).from_config(config)


def is_distributed(optimizer: Any) -> bool:
    """True for an optimizer returned by :func:`DistributedOptimizer`.

    Example::

        assert hvd.optimizer.is_distributed(model.optimizer)
    """
    return isinstance(optimizer, _DistributedOptimizerMixin)


def PartialDistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    groups: Any = None,
    process_set: Any = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
    *,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
) -> Any:
    """A :func:`DistributedOptimizer` that leaves the gradients of ``local_layers`` out of
    the allreduce: each rank applies its own gradient to those layers' trainable weights
    (divided by the number of ranks when ``scale_local_gradients`` is on, as Horovod's), so
    their weights differ between ranks while every other weight stays identical.

    Args:
        optimizer: the ``keras.optimizers.Optimizer`` to wrap (not yet used for training).
        name: as in :func:`DistributedOptimizer`.
        device_dense: as in :func:`DistributedOptimizer` (accepted, unused).
        device_sparse: as in :func:`DistributedOptimizer` (accepted, unused).
        compression: as in :func:`DistributedOptimizer`.
        sparse_as_dense: as in :func:`DistributedOptimizer`.
        gradient_predivide_factor: as in :func:`DistributedOptimizer`.
        op: ``hvd.Average`` (default) or ``hvd.Sum`` (Horovod supports only these here).
        groups: as in :func:`DistributedOptimizer`.
        process_set: as in :func:`DistributedOptimizer`.
        local_layers: a built ``keras.layers.Layer`` or a list of them whose trainable
            weights are local; ``None`` makes this a plain ``DistributedOptimizer``.
        scale_local_gradients: divide the local gradients by the process set's size.
        backward_passes_per_step: as in :func:`DistributedOptimizer` (keyword-only: Horovod
            0.28.1 has no such parameter here; its later versions insert it after ``op``);
            the local gradients are accumulated and scaled like the reduced ones.
        average_aggregated_gradients: as in :func:`DistributedOptimizer` (keyword-only).

    Example::

        import keras
        import kolo.keras as hvd

        hvd.init()
        head = keras.layers.Dense(3)  # per-rank head
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(16), head])
        opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[head])
        model.compile(optimizer=opt, loss="mse")
    """
    reduce_op = resolve_op(op, None)
    if reduce_op not in (Average, _core.Sum):
        raise InvalidValueError(
            f"PartialDistributedOptimizer supports op=hvd.Average or hvd.Sum (as Horovod), not "
            f"{reduce_op.name}; use DistributedOptimizer for other ops"
        )
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    else:
        local_layers = list(local_layers)
    for layer in local_layers:
        if not isinstance(layer, keras.layers.Layer):
            raise InvalidValueError(
                f"local_layers must be keras.layers.Layer instances, got {type(layer).__name__}"
            )
        if not layer.built:
            raise InvalidValueError(
                f"local layer {layer.name!r} is not built yet, so it has no weights to keep "
                "local; build the model first (keras.Input(...) or model.build(shape))"
            )
    opt = DistributedOptimizer(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=reduce_op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt
