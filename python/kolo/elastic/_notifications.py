"""Host-update notifications from the job driver, as Horovod's ``WorkerNotificationManager``.

The driver tells every worker when hosts were added to or removed from the job; the worker's
engine keeps those notices until :func:`kolo._core.host_updates` drains them. The manager here
hands what it drains to the registered states (Horovod's listeners). Whether a commit raises is
decided natively (:func:`kolo._core.check_host_updates`).
"""

from __future__ import annotations

import enum
import logging
import threading
from typing import Any, Callable, Optional

_log = logging.getLogger("kolo.elastic")


class HostUpdateResult(enum.IntFlag):
    """What changed in a host update, as Horovod's ``HostUpdateResult`` (bit flags):
    ``no_update`` (0), ``removed`` (1), ``added`` (2), ``mixed`` (3, both)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class WorkerNotificationManager:
    """Delivers the driver's host updates to the states registered as listeners.

    ``init()`` binds the source of updates; as in Horovod, a process that was not launched
    by an elastic-capable driver has none, and its listeners never receive an update.
    ``poll()`` drains the source and calls ``listener.on_hosts_updated(timestamp, update)``
    on every listener.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._source: Optional[Callable[[], list[tuple[float, int]]]] = None
        self._listeners: set[Any] = set()

    def init(self) -> None:
        """Binds the engine's queue of host updates (once; later calls do nothing)."""
        with self._lock:
            if self._source is not None:
                return
            try:
                from kolo._core import host_updates
            except ImportError:
                _log.debug("this kolo build delivers no host updates (no elastic driver support)")
                return
            self._source = host_updates

    def register_listener(self, listener: Any) -> None:
        """Adds a state that receives host updates."""
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener: Any) -> None:
        """Removes a state added by :meth:`register_listener`."""
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """Hands one host update to every listener."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, HostUpdateResult(int(update_res)))

    def poll(self) -> None:
        """Drains the host updates this worker received since the last poll and hands them to
        the listeners (nothing when no source is bound)."""
        source = self._source
        if source is None:
            return
        for timestamp, update in source():
            _log.info("host update received: %s at %.3f", HostUpdateResult(int(update)), timestamp)
            self.handle_hosts_updated(float(timestamp), update)
