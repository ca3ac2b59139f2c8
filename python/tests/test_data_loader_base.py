"""kolo.data.BaseDataLoader and AsyncDataLoaderMixin (Horovod's horovod.data) with real
threads: batches and epochs in order, the bounded read-ahead, an exception in the producer
raised in the consumer, close() ending the thread and a waiting consumer, and the mixin on
kolo's ParquetLoader."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kolo.exceptions
from kolo.data import AsyncDataLoaderMixin, BaseDataLoader, ParquetLoader, data_loader_base


class CountingLoader(BaseDataLoader):
    """Epochs of ``batches`` numbers; ``produced`` counts what ``_iterate`` handed out and
    ``threads`` records the threads it ran on."""

    def __init__(self, batches: int = 5, fail_after: int | None = None, endless=False):
        self.batches = batches
        self.fail_after = fail_after
        self.endless = endless
        self.produced = 0
        self.threads: list[threading.Thread] = []

    def __len__(self):
        return self.batches

    def _iterate(self):
        self.threads.append(threading.current_thread())
        count = 0
        while self.endless or count < self.batches:
            if self.fail_after is not None and count == self.fail_after:
                raise ValueError(f"bad record after {count} batches")
            self.produced += 1
            yield count
            count += 1

    def _process_batch(self, batch):
        return ("batch", batch)


class AsyncCountingLoader(AsyncDataLoaderMixin, CountingLoader):
    pass


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_base_loader_iterates_through_process_batch_and_names_what_is_missing():
    assert list(CountingLoader(3)) == [("batch", 0), ("batch", 1), ("batch", 2)]
    bare = BaseDataLoader()
    with pytest.raises(NotImplementedError, match="__len__"):
        len(bare)
    with pytest.raises(NotImplementedError, match="_iterate"):
        next(iter(bare))


def test_async_loader_reads_epochs_on_its_thread_in_order():
    loader = AsyncCountingLoader(async_loader_queue_size=3, batches=4)
    try:
        assert not loader.started
        for _ in range(3):
            assert list(loader) == [("batch", i) for i in range(4)]
        assert loader.started and loader.thread.is_alive()
        assert set(loader.threads) == {loader.thread}
        assert len(loader) == 4
    finally:
        loader.close_async_loader()
    assert not loader.started


def test_async_loader_reads_ahead_at_most_the_queue_size():
    loader = AsyncCountingLoader(async_loader_queue_size=2, endless=True)
    try:
        batches = iter(loader)
        assert next(batches) == ("batch", 0)
        # two batches queued and a third one waiting to be put: then the thread waits
        wait_until(lambda: loader.produced == 4)
        time.sleep(0.3)
        assert loader.produced == 4
        assert [next(batches) for _ in range(3)] == [("batch", i) for i in (1, 2, 3)]
        wait_until(lambda: loader.produced == 7)
    finally:
        loader.close_async_loader()


def test_async_loader_raises_the_producers_exception_in_the_consumer_then_restarts():
    loader = AsyncCountingLoader(async_loader_queue_size=4, batches=5, fail_after=2)
    first_thread = None
    try:
        seen = []
        with pytest.raises(ValueError, match="bad record after 2 batches"):
            for batch in loader:
                first_thread = loader.thread
                seen.append(batch)
        assert seen == [("batch", 0), ("batch", 1)]
        assert not first_thread.is_alive()
        # iterating again starts a new thread (and meets the same error)
        with pytest.raises(ValueError):
            list(loader)
        assert len(set(loader.threads)) == 2
    finally:
        loader.close_async_loader()


def test_close_stops_a_thread_blocked_on_a_full_queue_and_iteration_restarts():
    loader = AsyncCountingLoader(async_loader_queue_size=2, endless=True)
    batches = iter(loader)
    assert next(batches) == ("batch", 0)
    thread = loader.thread
    wait_until(lambda: loader.produced == 4)  # the thread now waits on the full queue
    started = time.monotonic()
    loader.close_async_loader()
    assert time.monotonic() - started < 2
    assert not thread.is_alive()
    assert not loader.started
    assert list(batches) == []  # the generator from before the close ends
    loader.endless = False
    loader.batches = 2
    try:
        assert list(loader) == [("batch", 0), ("batch", 1)]
        assert loader.thread is not thread
    finally:
        loader.close_async_loader()
    loader.close_async_loader()  # closing again does nothing


def test_close_ends_a_waiting_consumer_and_times_out_on_a_stuck_iterate():
    release = threading.Event()

    class StuckLoader(AsyncDataLoaderMixin, BaseDataLoader):
        close_timeout_s = 0.2

        def _iterate(self):
            yield "first"
            release.wait(30)

    loader = StuckLoader(async_loader_queue_size=4)
    taken = []

    def consume():
        for batch in loader:
            taken.append(batch)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    wait_until(lambda: taken == ["first"])
    producer = loader.thread
    with pytest.raises(kolo.exceptions.TimeoutError, match="still in _iterate"):
        loader.close_async_loader()
    consumer.join(5)
    assert not consumer.is_alive()  # the consumer's wait ended with the close
    release.set()
    producer.join(5)
    assert not producer.is_alive()  # once _iterate returns, the thread ends


def test_queue_size_zero_iterates_in_the_calling_thread():
    loader = AsyncCountingLoader(async_loader_queue_size=0, batches=2)
    assert list(loader) == [("batch", 0), ("batch", 1)]
    assert loader.threads == [threading.current_thread()]
    loader.close_async_loader()


def test_queue_size_must_be_an_int():
    with pytest.raises(kolo.exceptions.InvalidValueError, match="async_loader_queue_size"):
        AsyncCountingLoader(async_loader_queue_size="64")


def test_debug_data_loader_logs_each_batch(caplog):
    loader = AsyncCountingLoader(async_loader_queue_size=2, debug_data_loader=True, batches=2)
    with caplog.at_level(logging.INFO, logger=data_loader_base.__name__):
        try:
            list(loader)
        finally:
            loader.close_async_loader()
    text = caplog.text
    assert "queued batch #1" in text and "took batch #1" in text
    assert "took the end of the epoch after 2 batches" in text


class AsyncParquetLoader(AsyncDataLoaderMixin, ParquetLoader):
    pass


def test_the_mixin_reads_kolos_parquet_loader_ahead(tmp_path):
    pq.write_table(pa.table({"x": np.arange(100, dtype=np.int64)}), tmp_path / "part-0.parquet", 25)
    with ParquetLoader(tmp_path, "x", batch_size=10, to="numpy") as plain:
        assert isinstance(plain, BaseDataLoader)
    loader = AsyncParquetLoader(
        async_loader_queue_size=4,
        dataset=tmp_path,
        columns=["x"],
        batch_size=10,
        shuffle=False,
        to="numpy",
    )
    try:
        for _ in range(2):
            rows = []
            for batch in loader:
                rows.extend(batch["x"].tolist())
                assert len(loader) == 10  # while the thread is inside next_batch()
            assert rows == list(range(100))
        assert loader.thread.is_alive()
    finally:
        loader.close_async_loader()
        loader.close()
