"""Horovod's ``horovod.tensorflow.mpi_ops``: the collectives on TensorFlow tensors.

Every op works eagerly and inside ``tf.function``. A call crosses into kolo's engine once for
all its tensors (a ``grouped_*`` op hands every tensor over before it waits for any, so the
engine fuses them): eagerly through ``tensor.numpy()``, in a graph as ONE stateful
``tf.numpy_function`` node (``kolo.keras._bridge``). No custom op is compiled against
TensorFlow, so one kolo wheel works with every TensorFlow version; XLA
(``jit_compile=True``) cannot call back into Python and is refused with
:class:`~kolo.exceptions.ConfigError`.

The differentiable ops (allreduce, allgather, broadcast, alltoall, reducescatter) carry
Horovod's gradients through ``tf.custom_gradient``. ``ignore_name_scope`` is accepted for
Horovod compatibility (kolo's op names never include TensorFlow name scopes).

Inside ``tf.function`` an error raised by the engine (e.g. a
:class:`~kolo.exceptions.MismatchError`) reaches the caller as a ``tf.errors.OpError`` whose
message starts with the kolo exception's name; eagerly the kolo exception itself is raised.

Example::

    import tensorflow as tf
    import kolo.tensorflow as hvd

    hvd.init()

    @tf.function
    def step(x):
        return hvd.allgather(x), hvd.broadcast(x, root_rank=0)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from kolo import _core
from kolo._core import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    resolve_op,
    size,
)
from kolo._lifecycle import init, shutdown
from kolo.exceptions import InvalidArgumentError
from kolo.keras import _arrays, _bridge
from kolo.process_sets import (
    ProcessSet,
    _live_sets,
    add_process_set,
    global_process_set,
    remove_process_set,
    resolve,
)
from kolo.tensorflow import _array_ops

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "add_process_set",
    "allgather",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "check_num_rank_power_of_2",
    "cross_rank",
    "cross_size",
    "global_process_set",
    "grouped_allgather",
    "handle_average_backwards_compatibility",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "process_set_included_op",
    "rank",
    "rank_op",
    "remove_process_set",
    "shutdown",
    "size",
    "size_op",
]

#: Runs a function as plain Python when a ``tf.function`` calls it: kolo's ops build their
#: graph nodes themselves, AutoGraph need not (and cannot always) convert them.
_not_converted = tf.autograph.experimental.do_not_convert

_XLA_HINT = (
    "run the step in tf.function(jit_compile=False) (kolo's collectives call into Python, "
    "which XLA cannot), or keep the XLA-compiled part free of collectives"
)


def _tensor(value: Any) -> Any:
    """``value`` (tensor, ``tf.Variable``, Keras variable, numpy array, number) as a tensor."""
    inner = getattr(value, "value", None)
    if inner is not None and not callable(inner) and not isinstance(value, tf.Variable):
        value = inner  # a keras.Variable: its backing tf.Variable
    return tf.convert_to_tensor(value)


def _cross(
    fn: Callable[[list[np.ndarray]], list[np.ndarray]],
    tensors: Sequence[Any],
    out_shapes: Optional[Sequence[Any]] = None,
    out_dtypes: Optional[Sequence[Any]] = None,
    name: str = "kolo_collective",
) -> list[Any]:
    return _bridge.call_tf(fn, tensors, out_shapes, out_dtypes, name, xla_hint=_XLA_HINT)


def _op_name(kind: str, name: Optional[str], ps: ProcessSet, tensors: Sequence[Any] = ()) -> str:
    """The name an op carries across ranks: the user's; inside a graph, the graph's name and
    the op's position among the kolo ops of its kind in that graph (``f/kolo.allreduce_2``),
    so it depends neither on the other ops a rank adds (``if hvd.rank() == 0: tf.print(...)``)
    nor on how often a rank traced (a rank that retraced alone, e.g. for a smaller last batch,
    still agrees with the others); eagerly, ``<kind>.noname.<n>`` in call order. Unnamed ops
    on a set other than the global one are counted per set (``<kind>.set<id>...``), so ops only
    its members call shift nothing."""
    if name is not None:
        return _core.op_name(kind, name)
    prefix = f"{kind}.set{ps.process_set_id}" if ps.process_set_id else kind
    if tensors and not tf.executing_eagerly():
        graph = tf.compat.v1.get_default_graph()
        # (A tf.cond branch's graph name ends in a process-wide uid: dropped.)
        graph_name = re.sub(r"_\d+$", "", getattr(graph, "name", "graph"))
        return f"{graph_name}/{graph.unique_name(f'kolo.{prefix}', mark_as_used=True)}"
    return _core.op_name(prefix, None)


def _names(base: str, count: int) -> list[str]:
    return [base] if count == 1 else [f"{base}.{i}" for i in range(count)]


def _may_record() -> bool:
    """False only when running eagerly with no ``tf.GradientTape`` recording: then nothing
    can ask for a gradient, and ``tf.custom_gradient``'s per-call cost (about 3 ms) is
    skipped. (TensorFlow's private ``record`` module; when it is missing, always True.)"""
    if not tf.executing_eagerly():
        return True
    try:
        from tensorflow.python.eager import record

        return bool(record.could_possibly_record())
    except (ImportError, AttributeError):
        return True


def _differentiable(
    forward: Callable[..., list[Any]],
    backward: Callable[[list[Any], list[Any], list[Any]], list[Any]],
    tensors: list[Any],
) -> list[Any]:
    """``forward(*tensors)``, with ``backward(inputs, outputs, output_grads)`` as its gradient
    when any input is floating point (integer tensors have no gradient)."""
    if not any(t.dtype.is_floating for t in tensors) or not _may_record():
        return forward(*tensors)

    @tf.custom_gradient
    def op(*xs: Any) -> Any:
        outs = forward(*xs)

        def grad(*dys: Any) -> list[Any]:
            dys = [tf.zeros_like(o) if d is None else d for d, o in zip(dys, outs)]
            grads = backward(list(xs), outs, list(dys))
            return [g if x.dtype.is_floating else None for g, x in zip(grads, xs)]

        return outs, grad

    return list(op(*tensors))


@_not_converted
def _grouped_allreduce(
    tensors: Sequence[Any],
    name: Optional[str] = None,
    op: Any = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> list[Any]:
    """Reduces the tensors over the ranks of ``process_set`` (``Sum`` by default) in one
    crossing; Horovod's gradient: the same allreduce of the output gradients."""
    _core.require_initialized()
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps = resolve(process_set)
    reduce_op = op if type(op) is ReduceOp else ReduceOp(op)
    if reduce_op is _core.Adasum:  # refused where it is called (while tracing), not in the graph
        _core.check_adasum(ps.size() or _core.size())
    names = _names(_op_name("allreduce", name, ps, tensors), len(tensors))

    def forward(*xs: Any) -> list[Any]:
        return _cross(
            lambda arrays: _arrays.allreduce(
                arrays, names, reduce_op, prescale_factor, postscale_factor, ps
            ),
            xs,
            name="kolo_allreduce",
        )

    def backward(xs: list[Any], outs: list[Any], dys: list[Any]) -> list[Any]:
        return _grouped_allreduce(
            dys,
            op=reduce_op,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            process_set=ps,
        )

    return _differentiable(forward, backward, tensors)


@_not_converted
def _allreduce(
    tensor: Any,
    name: Optional[str] = None,
    op: Any = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """Reduces one tensor (``Sum`` by default); see :func:`_grouped_allreduce`."""
    return _grouped_allreduce(
        [tensor], name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set
    )[0]


def _first_dims(tensors: list[Any], ps: ProcessSet) -> list[Any]:
    """Every rank's first dimension of each tensor, as int32 tensors of ``ps.size()`` entries."""
    dims = [tf.reshape(tf.shape(t, out_type=tf.int32)[0], [1]) for t in tensors]
    world = len(ps.ranks or [])
    return [tf.reshape(d, [world]) for d in grouped_allgather(dims, process_set=ps)]


@_not_converted
def grouped_allgather(
    tensors: Sequence[Any],
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> list[Any]:
    """Concatenates each tensor with the same-position tensors of the other ranks along the
    first dimension (rank order; the first dimension may differ between ranks), in one
    crossing.

    Gradient (Horovod's): the output gradient averaged over the ranks, then this rank's rows.

    Example::

        xs, ys = hvd.grouped_allgather([x, y])
    """
    _core.require_initialized()
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps = resolve(process_set)
    names = _names(_op_name("allgather", name, ps, tensors), len(tensors))
    shapes = [
        tf.TensorShape([None]).concatenate(t.shape[1:]) if t.shape.rank else None for t in tensors
    ]

    def forward(*xs: Any) -> list[Any]:
        return _cross(
            lambda arrays: _arrays.allgather(arrays, names, ps),
            xs,
            out_shapes=shapes,
            name="kolo_allgather",
        )

    def backward(xs: list[Any], outs: list[Any], dys: list[Any]) -> list[Any]:
        averaged = _grouped_allreduce(dys, op=Average, process_set=ps)
        me = ps.rank()
        return [
            tf.split(g, num_or_size_splits=dims, axis=0)[me]
            for g, dims in zip(averaged, _first_dims(xs, ps))
        ]

    return _differentiable(forward, backward, tensors)


@_not_converted
def allgather(
    tensor: Any,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order (the first
    dimension may differ between ranks; the others must agree).

    Example::

        all_labels = hvd.allgather(labels)  # (sum of every rank's rows, ...)
    """
    return grouped_allgather([tensor], name, ignore_name_scope, process_set)[0]


def _grouped_broadcast(
    tensors: Sequence[Any], root_rank: int, name: Optional[str], process_set: Any, kind: str
) -> list[Any]:
    _core.require_initialized()
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps = resolve(process_set)
    names = _names(_op_name(kind, name, ps, tensors), len(tensors))
    root = int(root_rank)

    def forward(*xs: Any) -> list[Any]:
        return _cross(
            lambda arrays: _arrays.broadcast(arrays, root, names, ps), xs, name="kolo_broadcast"
        )

    def backward(xs: list[Any], outs: list[Any], dys: list[Any]) -> list[Any]:
        averaged = _grouped_allreduce(dys, op=Average, process_set=ps)
        return averaged if rank() == root else [g * 0 for g in averaged]

    return _differentiable(forward, backward, tensors)


@_not_converted
def broadcast(
    tensor: Any,
    root_rank: int,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """Returns ``root_rank``'s ``tensor`` on every rank (``root_rank`` is a global rank, a
    member of the process set).

    Gradient (Horovod's): the output gradient averaged over the ranks on the root, zero
    elsewhere.

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    return _grouped_broadcast([tensor], root_rank, name, process_set, "broadcast")[0]


@_not_converted
def broadcast_(
    variables: Sequence[Any],
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> list[Any]:
    """Assigns ``root_rank``'s values to ``variables`` in place on every rank (one crossing)
    and returns their new values.

    Example::

        hvd.broadcast_(model.variables, root_rank=0)
    """
    variables = list(variables)
    values = _grouped_broadcast(variables, root_rank, name, process_set, "broadcast_")
    assigns = [var.assign(value) for var, value in zip(variables, values)]
    if tf.executing_eagerly():
        return values
    # In a graph (tf.function or a TensorFlow 1 session), the values are read after the
    # assignments ran.
    with tf.control_dependencies([a for a in assigns if a is not None]):
        return [tf.identity(v) for v in values]


@_not_converted
def alltoall(
    tensor: Any,
    splits: Any = None,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
) -> Any:
    """Sends ``splits[i]`` consecutive rows of ``tensor`` to the i-th rank of the process set
    (without ``splits``, equal parts) and returns the rows received, in rank order; with
    ``splits``, also the int32 row counts received from each rank, as Horovod.

    Gradient (Horovod's): the output gradient sent back with the received splits.

    Example::

        out, received = hvd.alltoall(x, splits=[1, 3])
    """
    _core.require_initialized()
    ps = resolve(process_set)
    x = _tensor(tensor)
    given = tf.convert_to_tensor(splits) if splits is not None else tf.constant([], dtype=tf.int32)
    tensor_name = _op_name("alltoall", name, ps, [x])
    world = len(ps.ranks) if ps.ranks is not None else size()
    out_shape = tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else None

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        data, split = arrays
        return list(_array_ops.alltoall(data, split, tensor_name, ps))

    def forward(data: Any, split: Any) -> list[Any]:
        return _cross(
            run,
            [data, split],
            out_shapes=[out_shape, [world]],
            out_dtypes=[data.dtype, tf.int32],
            name="kolo_alltoall",
        )

    def backward(xs: list[Any], outs: list[Any], dys: list[Any]) -> list[Any]:
        grad, _ = alltoall(dys[0], splits=outs[1], process_set=ps)
        return [grad, None]

    output, received = _differentiable(forward, backward, [x, given])
    return (output, received) if splits is not None else output


def _rows_of(rows: Optional[int], ps: ProcessSet) -> Optional[int]:
    """This rank's rows of a reducescatter of ``rows`` rows (the engine's split: the first
    ``rows % size`` ranks of the set get one row more)."""
    if rows is None:
        return None
    world = len(ps.ranks) if ps.ranks is not None else size()
    me = ps.rank() if ps.process_set_id else rank()
    return rows // world + (1 if me < rows % world else 0)


@_not_converted
def _grouped_reducescatter(
    tensors: Sequence[Any],
    name: Optional[str] = None,
    op: Any = Sum,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[Any]:
    """Reduces each tensor over the ranks (``Sum`` by default) and returns this rank's part of
    the first dimension, in one crossing. Horovod's gradient: the output gradient (times the
    set's size for ``Sum``, times the scale factors) allgathered."""
    _core.require_initialized()
    tensors = [_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps = resolve(process_set)
    reduce_op = op if type(op) is ReduceOp else ReduceOp(op)
    names = _names(_op_name("reducescatter", name, ps, tensors), len(tensors))
    shapes = [
        tf.TensorShape([_rows_of(t.shape[0], ps)]).concatenate(t.shape[1:])
        if t.shape.rank
        else None
        for t in tensors
    ]

    def forward(*xs: Any) -> list[Any]:
        return _cross(
            lambda arrays: _array_ops.reducescatter(
                arrays, names, reduce_op, prescale_factor, postscale_factor, ps
            ),
            xs,
            out_shapes=shapes,
            name="kolo_reducescatter",
        )

    def backward(xs: list[Any], outs: list[Any], dys: list[Any]) -> list[Any]:
        factor = float(prescale_factor) * float(postscale_factor)
        if reduce_op is Sum:
            factor *= len(ps.ranks) if ps.ranks is not None else size()
        scaled = [g * tf.cast(factor, g.dtype) if factor != 1.0 else g for g in dys]
        return grouped_allgather(scaled, process_set=ps)

    return _differentiable(forward, backward, tensors)


@_not_converted
def _reducescatter(
    tensor: Any,
    name: Optional[str] = None,
    op: Any = Sum,
    ignore_name_scope: bool = False,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reducescatter of one tensor (``Sum`` by default); see :func:`_grouped_reducescatter`."""
    return _grouped_reducescatter(
        [tensor], name, op, ignore_name_scope, process_set, prescale_factor, postscale_factor
    )[0]


def _scalar_op(read: Callable[[], int], name: str) -> Any:
    """An int32 scalar read when the op runs (in a graph: every time it runs)."""
    return _cross(
        lambda _: [np.asarray(read(), dtype=np.int32)],
        [],
        out_shapes=[[]],
        out_dtypes=[tf.int32],
        name=name,
    )[0]


@_not_converted
def join() -> Any:
    """Declares that this rank has no more data (see ``kolo.torch.join``); returns the last
    rank to join as an int32 scalar tensor, the same on every rank.

    Example::

        last = hvd.join()
    """
    _core.require_initialized()
    return _scalar_op(_array_ops.join, "kolo_join")


def barrier(process_set: Any = global_process_set) -> None:
    """Blocks until every rank of the process set has called ``barrier()`` (a kolo addition:
    Horovod's TensorFlow API has none). Eager only.

    Example::

        hvd.barrier()
    """
    _arrays.barrier(resolve(process_set))


@_not_converted
def size_op(process_set_id: int = 0, name: Optional[str] = None) -> Any:
    """The number of ranks (of the process set ``process_set_id``) as an int32 scalar tensor,
    read when the op runs, so an elastic job's graph sees the current size.

    Example::

        n = hvd.size_op()
    """
    pid = int(process_set_id)

    def read() -> int:
        return size() if pid == 0 else len(_ranks_of(pid))

    return _scalar_op(read, name or "kolo_size")


def _ranks_of(process_set_id: int) -> list[int]:
    """The global ranks of the registered process set with id ``process_set_id``."""
    for ps in list(_live_sets.values()):
        if ps.process_set_id == process_set_id:
            return list(ps.ranks or [])
    raise InvalidArgumentError(
        f"no process set with id {process_set_id} is registered; pass a registered set's "
        "process_set_id"
    )


@_not_converted
def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> Any:
    """1 when this rank belongs to the process set ``process_set_id``, else 0, as an int32
    scalar tensor read when the op runs.

    Example::

        member = hvd.process_set_included_op(ps.process_set_id)
    """
    pid = int(process_set_id)

    def read() -> int:
        return 1 if pid == 0 or rank() in _ranks_of(pid) else 0

    return _scalar_op(read, name or "kolo_process_set_included")


@_not_converted
def local_size_op(name: Optional[str] = None) -> Any:
    """The number of ranks on this host as an int32 scalar tensor, read when the op runs.

    Example::

        n = hvd.local_size_op()
    """
    return _scalar_op(local_size, name or "kolo_local_size")


@_not_converted
def rank_op(name: Optional[str] = None) -> Any:
    """This process's rank as an int32 scalar tensor, read when the op runs.

    Example::

        r = hvd.rank_op()
    """
    return _scalar_op(rank, name or "kolo_rank")


@_not_converted
def local_rank_op(name: Optional[str] = None) -> Any:
    """This process's rank on its host as an int32 scalar tensor, read when the op runs.

    Example::

        r = hvd.local_rank_op()
    """
    return _scalar_op(local_rank, name or "kolo_local_rank")


def handle_average_backwards_compatibility(op: Any, average: Optional[bool]) -> ReduceOp:
    """Horovod's rule for the deprecated ``average=``: ``op`` wins, ``average`` maps to
    Average/Sum (with a DeprecationWarning), the default is Average.

    Example::

        op = hvd.handle_average_backwards_compatibility(None, True)  # hvd.Average
    """
    return resolve_op(op, average)


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Whether ``num_rank`` is a power of two (what Adasum needs).

    Example::

        assert hvd.check_num_rank_power_of_2(4)
    """
    n = int(num_rank)
    return n > 0 and n & (n - 1) == 0
