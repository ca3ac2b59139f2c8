"""Horovod's elastic ``State`` and ``ObjectState``: what a training loop commits, restores after
a failed collective, and syncs from rank 0 after a reset."""

from __future__ import annotations

import queue
from typing import Any, Callable, Iterable

from kolo import _core
from kolo.elastic._notifications import HostUpdateResult, WorkerNotificationManager
from kolo.exceptions import HostsUpdatedInterrupt

#: The process's one notification manager (Horovod's ``notification_manager``): the run
#: decorator registers its state here, and ``check_host_updates`` polls it.
notification_manager = WorkerNotificationManager()


class HostMessageQueue(queue.Queue):
    """A state's queue of host updates (Horovod's ``State._host_messages``). In Horovod a
    service thread fills it as notices arrive; here asking whether it is empty first collects
    what the driver sent this worker, so code that waits for a notice on it (as Horovod's
    elastic tests do) sees it arrive."""

    def empty(self) -> bool:
        notification_manager.poll()
        return super().empty()


class State:
    """State kept in step across the workers of an elastic job (Horovod's ``State``).

    Subclasses define :meth:`save`, :meth:`restore` and :meth:`sync`; :meth:`commit` saves and
    then checks for host updates.

    Args:
        bcast_object: broadcasts a picklable object from rank 0 (e.g. ``hvd.broadcast_object``).
        get_rank: returns this worker's rank (e.g. ``hvd.rank``).

    Example::

        class Counter(kolo.elastic.State):
            def __init__(self):
                super().__init__(hvd.broadcast_object, hvd.rank)
                self.value = self._saved = 0
            def save(self): self._saved = self.value
            def restore(self): self.value = self._saved
            def sync(self): self.value = self._saved = self._bcast_object(self._saved)
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue = HostMessageQueue()
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: list[Callable[[], Any]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Registers functions called after every reset (a worker added or removed), e.g. to
        scale the learning rate with the new size.

        Example::

            state.register_reset_callbacks([lambda: set_lr(base_lr * hvd.size())])
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by the run decorator after a reset: drops queued host updates, calls
        :meth:`reset`, then the registered reset callbacks in order."""
        self._host_messages = HostMessageQueue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: HostUpdateResult) -> None:
        """Takes a host update in (called by the notification manager): queued, and recorded
        for this process's view (rank 0's view decides every rank's next commit)."""
        _core.record_host_update(timestamp, int(update_res))
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Saves the state to host memory, then checks for host updates (raising
        :class:`~kolo.exceptions.HostsUpdatedInterrupt` on every rank when there was one).

        A commit copies the state, so commit every few batches rather than every batch: it
        trades per-batch time against the steps lost when a worker fails.

        Example::

            if batch_idx % 10 == 0:
                state.commit()
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises :class:`~kolo.exceptions.HostsUpdatedInterrupt` on every rank when rank 0
        heard of a host update newer than the last one handled (Horovod's rule: rank 0's view
        decides, so every rank raises at the same point). ``skip_sync`` is true when hosts were
        only removed.

        Unlike Horovod's, this costs no collective: rank 0's view travels in the engine's cycle
        messages, and every rank reads the view of the same cycle — the latest that decided a
        global collective submitted before this call (see docs/elastic.md). An update that
        reaches rank 0 after that cycle is raised at a later commit.

        Example::

            try:
                state.check_host_updates()
            except HostsUpdatedInterrupt as interrupt:
                print("hosts changed; skip sync:", interrupt.skip_sync)
        """
        while not self._host_messages.empty():  # hands the driver's notices to the listeners
            self._host_messages.get()
        raised = _core.check_host_updates()
        if raised is not None:
            self._last_updated_timestamp, skip_sync = raised
            raise HostsUpdatedInterrupt(skip_sync)

    def save(self) -> None:
        """Saves the state to host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Restores the last committed state, undoing uncommitted changes."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Makes every worker's state rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Adjusts objects after a reset, before the sync (nothing by default)."""


class ObjectState(State):
    """State made of plain Python objects, given as keyword arguments and exposed as
    attributes (Horovod's ``ObjectState``). A commit records each attribute's current value (the
    object itself, as in Horovod): rebinding ``state.epoch = 3`` is undone by ``restore()``,
    changing a list in place is not; objects with their own state (a model, an optimizer, a
    scheduler) belong in a framework state such as ``TorchState``.

    Args:
        bcast_object: broadcasts a picklable object from rank 0 (``hvd.broadcast_object``).
        get_rank: returns this worker's rank (``hvd.rank``).
        kwargs: the attributes to track.

    Example::

        state = kolo.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0, batch=0)
        state.epoch += 1
        state.commit()
    """

    def __init__(
        self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any
    ) -> None:
        self._bcast_object = bcast_object
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        """Records the tracked attributes' current values as the committed state."""
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        """Sets the tracked attributes back to the committed state."""
        self._set_attrs()

    def sync(self) -> None:
        """Broadcasts rank 0's committed attributes and sets them on every rank."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)
