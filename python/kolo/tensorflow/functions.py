"""Horovod's ``horovod.tensorflow.functions``: ``broadcast_variables``, ``broadcast_object``
and ``allgather_object``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from kolo import _core
from kolo.keras import _arrays
from kolo.process_sets import global_process_set, resolve
from kolo.tensorflow import mpi_ops
from kolo.tensorflow.mpi_ops import _not_converted

__all__ = ["allgather_object", "broadcast_object", "broadcast_variables"]


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
    return mpi_ops.broadcast_(
        variables,
        root_rank,
        name=mpi_ops._op_name("broadcast_variables", None, resolve(process_set)),
        process_set=process_set,
    )


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
