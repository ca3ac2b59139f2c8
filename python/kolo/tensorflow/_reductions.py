"""Horovod's ``horovod.tensorflow`` reductions: ``allreduce``, ``grouped_allreduce``,
``reducescatter``, ``grouped_reducescatter`` with compression, the ``op``/``average`` rules and
``tf.IndexedSlices`` (gathered, not reduced, as Horovod).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import tensorflow as tf

from kolo._core import Adasum, Average, Sum, resolve_op
from kolo.exceptions import NotSupportedError
from kolo.process_sets import global_process_set, resolve
from kolo.tensorflow import mpi_ops
from kolo.tensorflow.compression import Compression
from kolo.tensorflow.mpi_ops import _not_converted


def _check_sparse(op: Any, prescale_factor: float, postscale_factor: float) -> None:
    if op is Adasum:
        raise NotSupportedError(
            "the Adasum reduction does not support sparse tensors (tf.IndexedSlices); pass "
            "sparse_as_dense=True to DistributedGradientTape, or convert with "
            "tf.convert_to_tensor"
        )
    if op not in (Sum, Average):
        raise NotSupportedError(
            f"only Sum and Average are supported with tf.IndexedSlices, got {op.name}; "
            "convert the gradient to a dense tensor (tf.convert_to_tensor) first"
        )
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotSupportedError(
            "prescale_factor/postscale_factor are not supported with tf.IndexedSlices; convert "
            "the gradient to a dense tensor (tf.convert_to_tensor) first"
        )


def _gather_slices(slices: list[Any], op: Any, process_set: Any) -> list[Any]:
    """Allreduces ``tf.IndexedSlices`` by gathering their values and indices (one crossing)."""
    ps = resolve(process_set)
    gathered = mpi_ops.grouped_allgather(
        [s.values for s in slices] + [s.indices for s in slices], process_set=ps
    )
    values, indices = gathered[: len(slices)], gathered[len(slices) :]
    world = len(ps.ranks or [])
    out = []
    for s, v, i in zip(slices, values, indices):
        if op is Average:
            v = v / tf.cast(world, v.dtype)
        out.append(tf.IndexedSlices(v, i, dense_shape=s.dense_shape))
    return out


@_not_converted
def allreduce(
    tensor: Any,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Reduces ``tensor`` over the ranks (``hvd.Average`` by default). A ``tf.IndexedSlices``
    is gathered instead (its values and indices from every rank; divided by the size for
    Average), as Horovod. ``device_dense``/``device_sparse`` are accepted for Horovod
    compatibility: kolo reduces TensorFlow tensors in host memory.

    Example::

        import kolo.tensorflow as hvd
        hvd.init()
        mean_loss = hvd.allreduce(loss, name="loss")
    """
    return grouped_allreduce(
        [tensor],
        average=average,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
        ignore_name_scope=ignore_name_scope,
        name=name,
    )[0]


@_not_converted
def grouped_allreduce(
    tensors: Sequence[Any],
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
    name: Optional[str] = None,
) -> list[Any]:
    """Reduces several tensors in one crossing into kolo's engine (which fuses them); the
    ``tf.IndexedSlices`` among them are gathered in one more. Returns the results in order.

    Example::

        w_sum, b_sum = hvd.grouped_allreduce([w, b], op=hvd.Sum)
    """
    tensors = list(tensors)
    if not tensors:
        return tensors
    reduce_op = resolve_op(op, average)
    out: list[Any] = [None] * len(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse(reduce_op, prescale_factor, postscale_factor)
        for i, result in zip(
            sparse, _gather_slices([tensors[i] for i in sparse], reduce_op, process_set)
        ):
            out[i] = result
    if dense:
        packed = [compression.compress(mpi_ops._tensor(tensors[i])) for i in dense]
        reduced = mpi_ops._grouped_allreduce(
            [p for p, _ in packed],
            name=name,
            op=reduce_op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=process_set,
        )
        for i, r, (_, ctx) in zip(dense, reduced, packed):
            out[i] = compression.decompress(r, ctx)
    return out


@_not_converted
def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = Average,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reduces ``tensor`` over the ranks (``hvd.Average`` by default) and returns this rank's
    part of the first dimension (the first ``rows % size`` ranks get one row more).

    Example::

        part = hvd.reducescatter(tf.ones([4, 2]), op=hvd.Sum)  # 2 rows each on 2 ranks
    """
    return _grouped(
        [tensor], compression, op, name, process_set, prescale_factor, postscale_factor
    )[0]


@_not_converted
def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: Any = Compression.none,
    op: Any = Average,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """Reducescatters several tensors in one crossing; returns this rank's parts in order.

    Example::

        a, b = hvd.grouped_reducescatter([x, y], op=hvd.Sum)
    """
    tensors = list(tensors)
    if not tensors:
        return tensors
    return _grouped(tensors, compression, op, None, process_set, prescale_factor, postscale_factor)


def _grouped(
    tensors: list[Any],
    compression: Any,
    op: Any,
    name: Optional[str],
    process_set: Any,
    prescale_factor: float,
    postscale_factor: float,
) -> list[Any]:
    reduce_op = resolve_op(op, None)
    packed = [compression.compress(mpi_ops._tensor(t)) for t in tensors]
    reduced = mpi_ops._grouped_reducescatter(
        [p for p, _ in packed],
        name=name,
        op=reduce_op,
        process_set=process_set,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed)]
