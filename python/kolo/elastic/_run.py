"""Horovod's elastic run loop (``run_fn``): sync, run, and on a failure restore and reset."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Optional, TypeVar

from kolo import _lifecycle
from kolo.elastic._state import notification_manager
from kolo.exceptions import (
    HorovodInternalError,
    HostsUpdatedInterrupt,
    InvalidArgumentError,
    ResetLimitExceededError,
)

_log = logging.getLogger("kolo.elastic")

#: The environment variable a launcher sets to cap the resets of each worker's run loop.
RESET_LIMIT_ENV = "KOLO_RESET_LIMIT"

F = TypeVar("F", bound=Callable[..., Any])


def reset_limit_from_env() -> Optional[int]:
    """The reset limit of ``KOLO_RESET_LIMIT`` (None when unset or empty)."""
    raw = os.environ.get(RESET_LIMIT_ENV, "").strip()
    if not raw:
        return None
    try:
        limit = int(raw)
    except ValueError:
        limit = -1
    if limit < 0:
        raise InvalidArgumentError(
            f"{RESET_LIMIT_ENV}={raw!r} is not a reset limit: give a whole number >= 0 (0: no "
            f"reset allowed), or unset it for no limit"
        )
    return limit


def run_fn(func: F, reset: Callable[[], None], reset_limit: Optional[int] = None) -> F:
    """Wraps ``func(state, *args, **kwargs)`` in Horovod's elastic loop, with ``reset`` (e.g.
    ``shutdown(); init()``) to rejoin the job.

    Each round syncs ``state`` from rank 0 (unless skipped) and calls ``func``. When a
    collective fails (:class:`~kolo.exceptions.HorovodInternalError`) the state is restored to
    its last commit, the job reset and the state synced again; on
    :class:`~kolo.exceptions.HostsUpdatedInterrupt` it resets without restoring, and skips
    the sync when the interrupt says so (hosts only removed). After each reset,
    ``state.on_reset()`` runs ``state.reset()`` and the reset callbacks. ``reset_limit`` (or,
    when None, ``KOLO_RESET_LIMIT``) caps the resets: one more raises
    :class:`~kolo.exceptions.ResetLimitExceededError` from the failure that asked for it.

    Example::

        run = kolo.elastic.run_fn(train, reset=lambda: (hvd.shutdown(), hvd.init()))
        run(state, epochs=3)
    """
    if reset_limit is not None and reset_limit < 0:
        raise InvalidArgumentError(
            f"reset_limit={reset_limit} is not a reset limit: give a whole number >= 0, or None"
        )

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        limit = reset_limit if reset_limit is not None else reset_limit_from_env()
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
                if limit is not None and resets >= limit:
                    raise ResetLimitExceededError(limit, resets) from cause
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
                reset()
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
