"""Horovod's ``horovod.tensorflow.functions``: ``broadcast_variables``, ``broadcast_object``
and ``allgather_object``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import tensorflow as tf

from kolo import _core
from kolo.exceptions import NotSupportedError
from kolo.keras import _arrays
from kolo.process_sets import global_process_set, resolve
from kolo.tensorflow import mpi_ops
from kolo.tensorflow.mpi_ops import _not_converted

__all__ = [
    "BroadcastGlobalVariablesHook",
    "allgather_object",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "refs_to_vars",
    "vars_to_refs",
]


@_not_converted
def broadcast_variables(
    variables: Iterable[Any],
    root_rank: int,
    process_set: Any = global_process_set,
    inplace: bool = False,
) -> Any:
    """Assigns ``root_rank``'s values to ``variables`` on every rank of the process set, in
    one crossing into kolo's engine (which fuses them); eagerly or inside ``tf.function``.
    Every rank must pass the same variables in the same order (e.g. ``model.variables``).
    ``inplace`` is accepted for Horovod compatibility: kolo always assigns the received values
    to the variables.

    Example::

        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    """
    variables = list(variables)
    if not variables:
        return None
    return mpi_ops.broadcast_(variables, root_rank, process_set=process_set)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> Any:
    """Returns ``root_rank``'s ``obj`` (anything cloudpickle can pickle) on every rank of the
    process set. ``session`` (TensorFlow 1) is accepted and unused. Eager only.

    Example::

        start_epoch = hvd.broadcast_object(start_epoch, root_rank=0)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    return _arrays.broadcast_object(
        obj, root_rank, mpi_ops._op_name("broadcast_object", name, ps), ps
    )


def broadcast_object_fn(
    root_rank: int = 0,
    session: Any = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> Any:
    """Horovod's TensorFlow 1 helper: a function ``fn(obj)`` that returns ``root_rank``'s
    ``obj`` on every rank of the process set. kolo broadcasts objects without a TensorFlow
    session, so ``session`` is accepted and unused and ``fn`` works in any mode.

    Example::

        bcast = hvd.broadcast_object_fn(root_rank=0, session=session)
        start_epoch = bcast(start_epoch)
    """
    del session

    def broadcast_fn(obj: Any) -> Any:
        return broadcast_object(
            obj, root_rank, name=name or "broadcast_object_fn", process_set=process_set
        )

    return broadcast_fn


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Horovod's TensorFlow 1 ``SessionRunHook``: once a session is created (e.g. by
    ``tf.compat.v1.train.MonitoredTrainingSession``), every global variable takes
    ``root_rank``'s value (:func:`broadcast_global_variables`). ``device`` is accepted for
    Horovod compatibility (kolo broadcasts host copies). Deprecated in TensorFlow 2, as in
    Horovod: use :func:`broadcast_variables`.

    Example::

        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as session:
            ...
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op: Any = None
        self.device = device

    def begin(self) -> None:
        """Builds the broadcast in the session's graph (again when the graph changed)."""
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        """Runs the broadcast once the variables are initialized."""
        session.run(self.bcast_op)


def allgather_object(
    obj: Any,
    session: Any = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> list[Any]:
    """Returns the list of every rank's ``obj`` in rank order. ``session`` (TensorFlow 1) is
    accepted and unused. Eager only.

    Example::

        hosts = hvd.allgather_object(socket.gethostname())
    """
    _core.require_initialized()
    ps = resolve(process_set)
    return _arrays.allgather_object(obj, mpi_ops._op_name("allgather_object", name, ps), ps)


def broadcast_global_variables(root_rank: int) -> Any:
    """Broadcasts all TensorFlow 1 global variables (``tf.compat.v1.global_variables()``)
    from ``root_rank`` to all other processes; in a TensorFlow 1 graph, returns what to run.
    Deprecated in TensorFlow 2, as in Horovod: eagerly it raises
    :class:`~kolo.exceptions.NotSupportedError`; use :func:`broadcast_variables`.

    Example::

        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(hvd.broadcast_global_variables(0))
    """
    if tf.executing_eagerly():
        raise NotSupportedError(
            "hvd.broadcast_global_variables() does not support eager execution; use "
            "hvd.broadcast_variables(<model/optimizer variables>, root_rank) instead"
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def vars_to_refs(vars: Any) -> Any:
    """Horovod's helper: a variable, or (nested) lists of them, as hashable references
    (``var.ref()``; lists become tuples).

    Example::

        key = hvd.vars_to_refs([w, b])
    """
    if isinstance(vars, list):
        return tuple(vars_to_refs(v) for v in vars)
    return vars.ref()


def refs_to_vars(refs: Any) -> Any:
    """Horovod's helper, the inverse of :func:`vars_to_refs`.

    Example::

        w, b = hvd.refs_to_vars(key)
    """
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
