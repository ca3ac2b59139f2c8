"""Horovod's elastic run loop (``run_fn``): sync, run, and on a failure restore and reset."""

from __future__ import annotations

import functools
import logging
import re
from typing import Any, Callable, Optional, TypeVar

from kolo import _lifecycle
from kolo.elastic._state import notification_manager
from kolo.exceptions import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    KoloError,
    ResetLimitExceededError,
)

_log = logging.getLogger("kolo.elastic")

#: How the job driver words its abort when a reset would pass ``--reset-limit`` (the driver
#: keeps the one count of the job's resets; collective/src/control/driver_state.rs).
_DRIVER_RESET_LIMIT = re.compile(r"exceeded its limit of (\d+) \(--reset-limit")

F = TypeVar("F", bound=Callable[..., Any])


def _driver_reset_limit(error: BaseException) -> Optional[int]:
    """The limit when ``error`` says the job driver stopped the job for its reset limit."""
    found = _DRIVER_RESET_LIMIT.search(str(error))
    return int(found.group(1)) if found else None


def run_fn(func: F, reset: Callable[[], None]) -> F:
    """Wraps ``func(state, *args, **kwargs)`` in Horovod's elastic loop, with ``reset`` (e.g.
    ``shutdown(); init()``) to rejoin the job.

    Each round syncs ``state`` from rank 0 (unless skipped) and calls ``func``. When a
    collective fails (:class:`~kolo.exceptions.HorovodInternalError`) the state is restored to
    its last commit, the job reset and the state synced again; on
    :class:`~kolo.exceptions.HostsUpdatedInterrupt` it resets without restoring, and skips
    the sync when the interrupt says so (hosts only removed). After each reset,
    ``state.on_reset()`` runs ``state.reset()`` and the reset callbacks. The job driver counts
    the job's resets (``kolorun --reset-limit``, ``reset_limit=`` of the launchers): when it
    stops the job for the limit, the reset fails here with
    :class:`~kolo.exceptions.ResetLimitExceededError` (its ``__cause__`` is the driver's
    error).

    Example::

        run = kolo.elastic.run_fn(train, reset=lambda: (hvd.shutdown(), hvd.init()))
        run(state, epochs=3)
    """

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        notification_manager.init()
        notification_manager.register_listener(state)
        skip_sync = False
        resets = 0
        try:
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError as err:
                    cause: BaseException = err
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as interrupt:
                    cause = interrupt
                    skip_sync = interrupt.skip_sync
                resets += 1
                _log.info(
                    "elastic reset %d (%s: %s)%s",
                    resets,
                    type(cause).__name__,
                    cause,
                    "; state restored to the last commit"
                    if isinstance(cause, HorovodInternalError)
                    else "",
                )
                try:
                    reset()
                except KoloError as err:
                    limit = _driver_reset_limit(err)
                    if limit is None:
                        raise
                    raise ResetLimitExceededError(limit, resets - 1) from err
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)

    return wrapper  # type: ignore[return-value]


def reset() -> None:
    """Leaves and rejoins the job in this process: ``shutdown()`` then ``init()`` (Horovod's
    ``_reset``); the new rank and size follow the job's new membership. The process sets the
    last ``init(process_sets=...)`` registered are registered again: those that fit the new
    size keep their ids, the others wait for a round big enough (see docs/elastic.md).

    Example::

        kolo.elastic.reset()
    """
    process_sets = _lifecycle.init_process_sets()
    _lifecycle.shutdown()
    _lifecycle.init(process_sets=process_sets)


def run(func: F) -> F:
    """Decorator running an elastic training function (Horovod's ``hvd.elastic.run``).

    The first argument of ``func`` is a :class:`~kolo.elastic.State`; it is synced from rank 0
    before ``func`` runs, and again after every reset. A failed collective restores the last
    commit and resets (``shutdown()`` + ``init()`` in this process); a host update raised by
    ``state.commit()`` resets without restoring. Do not call a collective as the decorated
    call itself: a joining worker syncs first.

    Example::

        @hvd.elastic.run
        def train(state):
            for state.epoch in range(state.epoch, epochs):
                ...
                state.commit()

        train(hvd.elastic.TorchState(model, optimizer, epoch=0))
    """
    return run_fn(func, reset)
