"""Hostile or nonsensical values crossing the native binding: non-finite, negative or huge
timeouts and task counts are typed ``kolo.exceptions`` errors (never a Rust panic), and a
KeyboardInterrupt right after a submission cannot free a tensor the engine still uses."""

from __future__ import annotations

import gc
import math

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import kolo.torch as hvd
from kolo import _native
from kolo.exceptions import InvalidArgumentError

BAD_TIMEOUTS = [math.inf, -math.inf, math.nan, 1e300, -1.0]


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS)
def test_wait_refuses_a_timeout_that_is_no_number_of_seconds(timeout: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"timeout=.* must be a number of seconds"):
        _native.wait(1, timeout=timeout)


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS)
def test_launch_driver_refuses_bad_start_and_heartbeat_timeouts(timeout: float) -> None:
    with pytest.raises(InvalidArgumentError, match="start_timeout="):
        _native.LaunchDriver(1, start_timeout=timeout)
    with pytest.raises(InvalidArgumentError, match="heartbeat_timeout="):
        _native.LaunchDriver(1, heartbeat_timeout=timeout)


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS)
def test_launch_driver_poll_refuses_bad_timeouts(timeout: float) -> None:
    driver = _native.LaunchDriver(1)
    try:
        with pytest.raises(InvalidArgumentError, match="timeout="):
            driver.poll(timeout)
        assert driver.poll(0.0) == []
    finally:
        driver.shutdown()


@pytest.mark.parametrize("num_tasks", [0, 2**40, 2**63])
def test_launch_driver_refuses_a_task_count_out_of_range(num_tasks: int) -> None:
    with pytest.raises(InvalidArgumentError, match=f"num_tasks={num_tasks} must be between 1"):
        _native.LaunchDriver(num_tasks)


@pytest.fixture
def single_rank():
    hvd.init()
    yield
    hvd.shutdown()


def test_a_keyboard_interrupt_right_after_submit_does_not_free_the_tensor(
    single_rank, monkeypatch
) -> None:
    submitted: list[int] = []
    real_submit = _native.submit

    def interrupted_submit(*args, **kwargs):
        # Ctrl-C lands after the engine took the tensor, before kolo registered the handle.
        submitted.append(real_submit(*args, **kwargs))
        raise KeyboardInterrupt

    monkeypatch.setattr(_native, "submit", interrupted_submit)
    tensor = torch.ones(1 << 16)
    memory = StorageWeakRef(tensor.untyped_storage())
    with pytest.raises(KeyboardInterrupt):
        hvd.allreduce_async_(tensor, name="interrupted")
    del tensor
    gc.collect()
    assert not memory.expired(), "the engine's tensor was freed while its op was in flight"
    assert _native.holds(submitted[0])
    monkeypatch.undo()
    _native.wait(submitted[0])
    gc.collect()
    assert not _native.holds(submitted[0])
    assert memory.expired(), "the tensor is released once its op was waited for"


def test_tied_weights_are_broadcast_once(single_rank) -> None:
    shared = torch.nn.Parameter(torch.ones(4))
    hvd.broadcast_parameters({"embed.weight": shared, "head.weight": shared}, root_rank=0)
