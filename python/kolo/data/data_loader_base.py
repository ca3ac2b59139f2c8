"""Horovod's data loader bases (``horovod.data.data_loader_base`` → ``kolo.data``):
:class:`BaseDataLoader` (a loader defines ``_iterate()`` and ``__len__``) and
:class:`AsyncDataLoaderMixin` (reads ``_iterate()`` on a background thread into a bounded
queue). :class:`kolo.data.ParquetLoader` is a ``BaseDataLoader``, so the mixin applies to it.

Example::

    from kolo.data import AsyncDataLoaderMixin, ParquetLoader

    class AsyncParquetLoader(AsyncDataLoaderMixin, ParquetLoader):
        pass

    loader = AsyncParquetLoader(async_loader_queue_size=8, dataset="/data/train",
                                columns=["features", "label"], batch_size=64)
    for batch in loader:       # one epoch; the thread already reads the next one
        ...
    loader.close_async_loader()
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Iterator

from kolo.exceptions import InvalidValueError, TimeoutError

__all__ = ["AsyncDataLoaderMixin", "BaseDataLoader"]

log = logging.getLogger(__name__)

#: How often a waiting producer or consumer looks whether the loader was closed (seconds).
_POLL_S = 0.05


class BaseDataLoader:
    """A data loader in Horovod's form: a subclass defines ``_iterate()`` (a generator of
    batches) and ``__len__`` (batches per epoch); iterating yields each batch through
    ``_process_batch`` (a hook the trainers use to reshape batches).

    Example::

        class ListLoader(BaseDataLoader):
            def __init__(self, batches):
                self.batches = batches

            def __len__(self):
                return len(self.batches)

            def _iterate(self):
                yield from self.batches

        assert list(ListLoader([1, 2])) == [1, 2]
    """

    def __len__(self) -> int:
        """Batches per epoch."""
        raise NotImplementedError(f"{type(self).__name__} must define __len__ (batches per epoch)")

    def _iterate(self) -> Iterator[Any]:
        """Yields the batches of one epoch."""
        raise NotImplementedError(
            f"{type(self).__name__} must define _iterate(), a generator of one epoch's batches"
        )

    def __iter__(self) -> Iterator[Any]:
        for batch in self._iterate():
            yield self._process_batch(batch)

    def _process_batch(self, batch: Any) -> Any:
        """The batch as handed out (the identity here)."""
        return batch


class _EndOfEpoch:
    """Queued after the last batch of each epoch."""


class _Failure:
    """Queued when ``_iterate()`` raised; the consumer raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END_OF_EPOCH = _EndOfEpoch()


class AsyncDataLoaderMixin:
    """Reads a :class:`BaseDataLoader`'s ``_iterate()`` on a background thread into a queue
    of ``async_loader_queue_size`` batches; iterating takes one epoch from the queue while the
    thread reads ahead (into the next epoch too). Put it first among the bases; its
    ``__init__`` passes the other arguments on. ``async_loader_queue_size=0`` iterates in the
    calling thread.

    The thread starts on the first iteration. An exception raised by ``_iterate()`` is raised
    by the iteration that reaches it (then the thread has ended; iterating again starts a new
    one). :meth:`close_async_loader` stops the thread and waits for it (at most
    ``close_timeout_s``); an iteration waiting for a batch then ends, and iterating again
    starts a new thread. ``debug_data_loader=True`` logs every batch queued and taken.

    Example::

        class AsyncLoader(AsyncDataLoaderMixin, MyLoader):
            pass

        loader = AsyncLoader(async_loader_queue_size=16, debug_data_loader=False, path=path)
        for epoch in range(3):
            for batch in loader:
                train_step(batch)
        loader.close_async_loader()
    """

    #: Seconds :meth:`close_async_loader` waits for the thread to end.
    close_timeout_s: float = 60.0

    def __init__(
        self, async_loader_queue_size: int = 64, debug_data_loader: bool = False, *args, **kwargs
    ) -> None:
        if isinstance(async_loader_queue_size, bool) or not isinstance(
            async_loader_queue_size, int
        ):
            raise InvalidValueError(
                f"async_loader_queue_size={async_loader_queue_size!r} must be an int: the "
                "number of batches read ahead, or 0 to read in the calling thread"
            )
        self.async_loader_queue_size = async_loader_queue_size
        self.debug_data_loader = debug_data_loader
        super().__init__(*args, **kwargs)
        log.debug(
            "%s: AsyncDataLoaderMixin with async_loader_queue_size=%d",
            type(self).__name__,
            async_loader_queue_size,
        )
        self.started = False
        if self.async_loader_queue_size > 0:
            self._new_thread()

    def _new_thread(self) -> None:
        self.finished_event = threading.Event()
        self.queue: queue.Queue = queue.Queue(self.async_loader_queue_size)
        self.thread = threading.Thread(
            target=self._async_worker,
            args=(self.finished_event, self.queue),
            name=f"kolo-async-loader-{type(self).__name__}",
            daemon=True,
        )
        self.started = False

    def _debug(self, message: str, *args: Any) -> None:
        if self.debug_data_loader:
            log.info("%s[%d] " + message, type(self).__name__, self.async_loader_queue_size, *args)

    def close_async_loader(self) -> None:
        """Stops the background thread, drops the batches it queued, and waits for it to end.

        Raises :class:`~kolo.exceptions.TimeoutError` if the thread is still inside
        ``_iterate()`` after ``close_timeout_s`` seconds (an ``_iterate()`` that blocks
        without end).

        Example::

            loader.close_async_loader()
        """
        if self.async_loader_queue_size <= 0 or not self.started:
            return
        self.finished_event.set()
        dropped = 0
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
            dropped += 1
        self._debug("close: dropped %d queued items, joining the thread", dropped)
        thread = self.thread
        thread.join(self.close_timeout_s)
        self._new_thread()
        if thread.is_alive():
            raise TimeoutError(
                f"the async loader thread of {type(self).__name__} is still in _iterate() "
                f"{self.close_timeout_s} s after close_async_loader(): make _iterate() "
                "return (it is left running as a daemon thread)"
            )

    def _async_worker(self, finished: threading.Event, batches: queue.Queue) -> None:
        """The thread: epochs of ``_iterate()`` into ``batches`` until ``finished`` is set."""

        def put(item: Any) -> bool:
            while not finished.is_set():
                try:
                    batches.put(item, timeout=_POLL_S)
                    return True
                except queue.Full:
                    pass
            return False

        try:
            while not finished.is_set():
                epoch = self._iterate()
                count = 0
                try:
                    for batch in epoch:
                        if not put(batch):
                            return
                        self._debug("queued batch #%d", count)
                        count += 1
                finally:
                    close = getattr(epoch, "close", None)
                    if close is not None:
                        close()
                self._debug("end of epoch after %d batches", count)
                if not put(_END_OF_EPOCH):
                    return
        except BaseException as error:
            self._debug("_iterate() raised %r", error)
            put(_Failure(error))

    def __iter__(self) -> Iterator[Any]:
        if self.async_loader_queue_size <= 0:
            for batch in self._iterate():
                yield self._process_batch(batch)
            return
        if not self.started:
            self.started = True
            self.thread.start()
        finished, batches = self.finished_event, self.queue
        count = 0
        while True:
            item = _take(finished, batches)
            if item is _END_OF_EPOCH:
                self._debug("took the end of the epoch after %d batches", count)
                return
            if isinstance(item, _Failure):
                self.thread.join(self.close_timeout_s)
                self._new_thread()
                raise item.error
            self._debug("took batch #%d", count)
            count += 1
            yield self._process_batch(item)


def _take(finished: threading.Event, batches: queue.Queue) -> Any:
    """The next queued item, or the end of the epoch once the loader is closed."""
    while not finished.is_set():
        try:
            return batches.get(timeout=_POLL_S)
        except queue.Empty:
            pass
    return _END_OF_EPOCH
