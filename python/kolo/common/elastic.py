"""Horovod's ``horovod.common.elastic`` module path: the framework-neutral elastic classes of
:mod:`kolo.elastic`, so imports written for Horovod work with ``horovod`` replaced by ``kolo``.

Example::

    from kolo.common.elastic import ObjectState, run_fn

    state = ObjectState(hvd.broadcast_object, hvd.rank, epoch=0)
"""

from kolo.elastic import ObjectState, State, notification_manager, run_fn

__all__ = ["ObjectState", "State", "notification_manager", "run_fn"]
