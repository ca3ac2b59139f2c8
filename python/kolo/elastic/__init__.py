"""Horovod's framework-neutral elastic API (``horovod.common.elastic``) on kolo.

An elastic job keeps training while workers come and go: the training function, wrapped by
:func:`run`, commits its :class:`State` from time to time; when a collective fails (a worker
died) every survivor restores the last commit and rejoins the job (``shutdown()`` + ``init()``
in the same process), and when the driver reports added or removed hosts, ``commit()`` raises
:class:`~kolo.exceptions.HostsUpdatedInterrupt` on every rank at the same point. The framework
adapters build on this: ``kolo.torch.elastic`` (``TorchState``, ``ElasticSampler``) and
``kolo.keras.elastic`` (``KerasState`` and callbacks). See docs/elastic.md.

Example::

    import kolo.torch as hvd
    from kolo.elastic import ObjectState, run

    hvd.init()
    state = ObjectState(hvd.broadcast_object, hvd.rank, epoch=0)

    @run
    def train(state):
        while state.epoch < 3:
            hvd.allreduce(torch.ones(1))
            state.epoch += 1
            state.commit()

    train(state)
"""

from kolo.elastic._notifications import HostUpdateResult, WorkerNotificationManager
from kolo.elastic._run import reset, run, run_fn
from kolo.elastic._state import ObjectState, State, notification_manager

__all__ = [
    "HostUpdateResult",
    "ObjectState",
    "State",
    "WorkerNotificationManager",
    "notification_manager",
    "reset",
    "run",
    "run_fn",
]
