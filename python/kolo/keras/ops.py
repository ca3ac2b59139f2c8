"""Horovod's ``horovod.tensorflow.keras`` collectives on Keras tensors of any supported backend.

Each op takes a backend tensor, a ``keras.Variable``, a numpy array or a Python number and
returns a tensor of the active backend. They run eagerly, and with the TensorFlow backend also
inside ``tf.function`` (see ``kolo.keras._bridge``).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from kolo import _core
from kolo._core import Average, resolve_op
from kolo.keras import _arrays, _bridge
from kolo.keras.compression import Compression
from kolo.process_sets import global_process_set, resolve

__all__ = [
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "grouped_allreduce",
    "reducescatter",
]


def allreduce(
    value: Any,
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Any = None,
    compression: Any = Compression.none,
    process_set: Any = global_process_set,
) -> Any:
    """Reduces ``value`` over all ranks (``hvd.Average`` by default) and returns the result.

    Example::

        import kolo.keras as hvd
        hvd.init()
        mean_loss = hvd.allreduce(keras.ops.convert_to_tensor(loss), name="loss")
    """
    return grouped_allreduce(
        [value],
        name=name,
        average=average,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        op=op,
        compression=compression,
        process_set=process_set,
    )[0]


def grouped_allreduce(
    values: list[Any],
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Any = None,
    compression: Any = Compression.none,
    process_set: Any = global_process_set,
) -> list[Any]:
    """Reduces several values as one fused operation; returns the results in order.

    Example::

        w_sum, b_sum = hvd.grouped_allreduce([w, b], op=hvd.Sum)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    base = _core.op_name("allreduce", name)
    names = [base] if len(values) == 1 else [f"{base}.{i}" for i in range(len(values))]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        packed = [compression.compress(a) for a in arrays]
        reduced = _arrays.allreduce(
            [p for p, _ in packed], names, reduce_op, prescale_factor, postscale_factor, ps
        )
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed)]

    return _bridge.call(run, values, name="kolo_allreduce")


def allgather(value: Any, name: Optional[str] = None, process_set: Any = global_process_set) -> Any:
    """Concatenates every rank's ``value`` along the first dimension, in rank order (the first
    dimension may differ between ranks).

    Example::

        all_labels = hvd.allgather(labels)  # (sum of every rank's rows, ...)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    names = [_core.op_name("allgather", name)]
    shapes = None
    if _bridge.in_tf_graph():
        shape = _bridge._tf().convert_to_tensor(value).shape
        shapes = [[None, *shape[1:]]] if shape.rank else None
    return _bridge.call(
        lambda arrays: _arrays.allgather(arrays, names, ps),
        [value],
        out_shapes=shapes,
        name="kolo_allgather",
    )[0]


def reducescatter(value: Any, name: Optional[str] = None, op: Any = Average) -> Any:
    """Reduces ``value`` over all ranks (``hvd.Average`` by default) and returns this rank's
    part of the first dimension: rank ``r`` of ``n`` gets ``rows // n`` rows, and the first
    ``rows % n`` ranks one row more (Horovod's split). ``value`` has the same shape on every
    rank.

    Example::

        import kolo.keras as hvd
        hvd.init()
        part = hvd.reducescatter(keras.ops.ones((4, 2)), op=hvd.Sum)  # (2, 2) of 2.0 on 2 ranks
    """
    _core.require_initialized()
    ps = resolve(global_process_set)
    reduce_op = resolve_op(op, None)
    names = [_core.op_name("reducescatter", name)]
    shapes = None
    if _bridge.in_tf_graph():
        shape = _bridge._tf().convert_to_tensor(value).shape
        if shape.rank:
            shapes = [[_rows_here(shape[0]), *shape[1:]]]
    return _bridge.call(
        lambda arrays: _arrays.reducescatter(arrays, names, reduce_op, 1.0, 1.0, ps),
        [value],
        out_shapes=shapes,
        name="kolo_reducescatter",
    )[0]


def _rows_here(rows: Optional[int]) -> Optional[int]:
    """This rank's share of ``rows`` in a reducescatter over every rank (``None`` if unknown)."""
    if rows is None:
        return None
    world, me = _core.size(), _core.rank()
    return rows // world + (1 if me < rows % world else 0)


def broadcast(
    value: Any, root_rank: int, name: Optional[str] = None, process_set: Any = global_process_set
) -> Any:
    """Returns ``root_rank``'s ``value`` on every rank.

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    names = [_core.op_name("broadcast", name)]
    return _bridge.call(
        lambda arrays: _arrays.broadcast(arrays, root_rank, names, ps),
        [value],
        name="kolo_broadcast",
    )[0]


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None
) -> Any:
    """Returns ``root_rank``'s ``obj`` (anything cloudpickle can pickle) on every rank.

    Example::

        start_epoch = hvd.broadcast_object(start_epoch, root_rank=0)
    """
    _core.require_initialized()
    name = _core.op_name("broadcast_object", name)
    return _arrays.broadcast_object(obj, root_rank, name, resolve(process_set))


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order.

    Example::

        hosts = hvd.allgather_object(socket.gethostname())
    """
    _core.require_initialized()
    name = _core.op_name("allgather_object", name)
    return _arrays.allgather_object(obj, name, resolve(process_set))


def barrier(process_set: Any = global_process_set) -> None:
    """Blocks until every rank of the process set has called ``barrier()``.

    Example::

        hvd.barrier()
    """
    _arrays.barrier(resolve(process_set))
