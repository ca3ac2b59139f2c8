"""Horovod's ``DistributedGradientTape`` and ``PartialDistributedGradientTape``: a
``tf.GradientTape`` whose ``gradient()`` averages the gradients over the ranks.

All gradients of one ``gradient()`` call cross into kolo's engine together: one crossing (one
``tf.numpy_function`` node inside ``tf.function``) for the dense gradients and one for the
``tf.IndexedSlices`` (gathered, as Horovod), or one per group with ``groups=``.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import tensorflow as tf

from kolo._core import Average, resolve_op
from kolo.exceptions import InvalidArgumentError
from kolo.process_sets import global_process_set, resolve
from kolo.tensorflow import _reductions
from kolo.tensorflow.compression import Compression


def _split_list(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` cut into ``parts`` consecutive lists of near-equal length (Horovod's
    ``split_list``)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [part for part in out if part]


def _key(source: Any) -> Any:
    """A hashable identity of a variable (``tf.Variable.ref()``; Keras 3 variables have none)."""
    ref = getattr(source, "ref", None)
    return ref() if callable(ref) else id(source)


class _GradientReducer:
    """Averages (or ``op``-reduces) a list of gradients over a process set, Horovod's
    ``_make_allreduce_grads_fn``."""

    def __init__(
        self,
        compression: Any,
        sparse_as_dense: bool,
        op: Any,
        gradient_predivide_factor: float,
        groups: Any,
        process_set: Any,
    ) -> None:
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = resolve_op(op, None)
        self.groups = groups
        self.process_set = process_set
        if self.op is Average:
            # The engine divides by the size for Average: split it around the sum.
            self.prescale = 1.0 / gradient_predivide_factor
            self.postscale = float(gradient_predivide_factor)
        else:
            self.prescale = self.postscale = 1.0

    def _grouped(self, grads: list[Any]) -> list[Any]:
        return _reductions.grouped_allreduce(
            grads,
            compression=self.compression,
            op=self.op,
            prescale_factor=self.prescale,
            postscale_factor=self.postscale,
            process_set=self.process_set,
        )

    def __call__(self, grads: list[Any], sources: list[Any]) -> list[Any]:
        if self.sparse_as_dense:
            grads = [
                tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads
            ]
        ps = resolve(self.process_set)
        if not ps.included():
            return grads  # Horovod's _allreduce_cond: not a member, nothing to reduce
        # Unlike Horovod (outside elastic mode), a 1-rank set still reduces (an identity, in
        # the engine): a step traced on 1 rank then stays right when an elastic job grows.
        present = [i for i, g in enumerate(grads) if g is not None]
        if isinstance(self.groups, list):
            position = {_key(s): i for i, s in enumerate(sources)}
            split: list[list[int]] = []
            taken: set[int] = set()
            for group in self.groups:
                members = [position[_key(v)] for v in group if _key(v) in position]
                members = [i for i in members if grads[i] is not None and i not in taken]
                taken.update(members)
                if members:
                    split.append(members)
            split.extend([i] for i in present if i not in taken)
        elif self.groups:
            split = _split_list(present, int(self.groups))
        else:
            split = [present] if present else []
        out = list(grads)
        for indices in split:
            for i, reduced in zip(indices, self._grouped([grads[i] for i in indices])):
                out[i] = reduced
        return out


class _DistributedGradientTape(tf.GradientTape):
    """A ``tf.GradientTape`` whose :meth:`gradient` reduces the gradients over the ranks."""

    def _kolo_setup(self, reducer: _GradientReducer, scale_local_gradients: bool) -> None:
        self._kolo_reduce = reducer
        self._kolo_scale_local = scale_local_gradients
        self._kolo_local_sources: set[Any] = set()

    def register_local_source(self, source: Any) -> None:
        """Keeps ``source``'s gradient local: it is not reduced over the ranks (divided by the
        set's size when ``scale_local_gradients``, as Horovod).

        Example::

            tape.register_local_source(model.layers[-1].kernel)
        """
        self._kolo_local_sources.add(_key(source))

    @tf.autograph.experimental.do_not_convert
    def gradient(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        use_generic_names: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The gradients of ``target`` with respect to ``sources`` (as ``tf.GradientTape``),
        reduced over the ranks of the process set (``hvd.Average`` by default).

        Example::

            grads = tape.gradient(loss, model.trainable_variables)
        """
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        shared = [i for i, s in enumerate(flat_sources) if _key(s) not in self._kolo_local_sources]
        reduced = self._kolo_reduce(
            [flat_grads[i] for i in shared], [flat_sources[i] for i in shared]
        )
        out = list(flat_grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._kolo_scale_local and self._kolo_local_sources:
            world = float(resolve(self._kolo_reduce.process_set).size() or 1)
            for i, s in enumerate(flat_sources):
                g = out[i]
                if _key(s) in self._kolo_local_sources and g is not None:
                    if isinstance(g, tf.IndexedSlices):
                        out[i] = tf.IndexedSlices(g.values / world, g.indices, g.dense_shape)
                    else:
                        out[i] = g / world
        return tf.nest.pack_sequence_as(grads, out)

    def get_local_and_global_gradients(
        self,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        use_generic_names: bool = False,
    ) -> tuple[list[Any], list[Any]]:
        """``(local, global)`` lists of ``(source, gradient)`` pairs: the registered local
        sources and the reduced ones.

        Example::

            local, shared = tape.get_local_and_global_gradients(loss, model.trainable_variables)
        """
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for s, g in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            (local if _key(s) in self._kolo_local_sources else shared).append((s, g))
        return local, shared


def DistributedGradientTape(
    gradtape: Any,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Wraps ``gradtape`` (a ``tf.GradientTape``, before or after it recorded) so that
    ``gradient()`` averages the gradients over the ranks (``op``), as Horovod.

    ``groups``: None (every gradient in one crossing), a number of groups, or lists of
    variables reduced together (the others alone). ``gradient_predivide_factor`` splits
    Average's division around the sum. ``tf.IndexedSlices`` gradients are gathered unless
    ``sparse_as_dense``. ``device_dense``/``device_sparse`` are accepted for Horovod
    compatibility (kolo reduces TensorFlow tensors in host memory).

    Example::

        @tf.function
        def step(images, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    """
    if gradient_predivide_factor != 1.0 and resolve_op(op, None) is not Average:
        raise InvalidArgumentError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups`",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    if groups is not None and not (
        isinstance(groups, list) or (isinstance(groups, int) and groups > 0)
    ):
        raise InvalidArgumentError(
            f"groups should be a positive integer or a list of lists of tf.Variable, got {groups!r}"
        )
    reducer = _GradientReducer(
        compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set
    )
    base = type(gradtape)
    cls = (
        _DistributedGradientTape
        if base is tf.GradientTape
        else type(base.__name__, (_DistributedGradientTape, base), {})
    )
    tape = cls(
        persistent=gradtape._persistent,
        watch_accessed_variables=gradtape._watch_accessed_variables,
    )
    tape._tape = gradtape._tape
    tape._kolo_setup(reducer, scale_local_gradients)
    return tape


def PartialDistributedGradientTape(
    gradtape: Any,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = global_process_set,
    local_layers: Optional[Any] = None,
    scale_local_gradients: bool = True,
) -> Any:
    """A :func:`DistributedGradientTape` that keeps the gradients of ``local_layers`` (Keras
    layers) local instead of reducing them.

    Example::

        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.layers[-1]])
    """
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise InvalidArgumentError(
                f"local_layers must be Keras layers, got {type(layer).__name__}"
            )
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
