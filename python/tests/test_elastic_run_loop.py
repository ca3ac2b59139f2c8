"""The elastic run loop's order of operations (Horovod's ``run_fn``), in one process: a State
subclass and a reset function of our own record what the loop calls. The same loop on real
ranks, with a real collective failure and shutdown()+init(), is in tests/test_elastic.py."""

from __future__ import annotations

import pickle

import pytest

from kolo.elastic import State, run_fn
from kolo.exceptions import (
    HostsUpdatedInterrupt,
    InternalError,
    MismatchError,
    RendezvousError,
    ResetLimitExceededError,
)


class RecordingState(State):
    def __init__(self, calls: list[str]) -> None:
        super().__init__(bcast_object=lambda obj: obj, get_rank=lambda: 0)
        self.calls = calls
        self.register_reset_callbacks([lambda: calls.append("callback")])

    def save(self) -> None:
        self.calls.append("save")

    def restore(self) -> None:
        self.calls.append("restore")

    def sync(self) -> None:
        self.calls.append("sync")

    def reset(self) -> None:
        self.calls.append("state.reset")


def run_with(failures: list[BaseException]) -> list[str]:
    calls: list[str] = []
    pending = list(failures)

    def train(state: State, value: int) -> int:
        calls.append("func")
        if pending:
            raise pending.pop(0)
        return value * 2

    wrapped = run_fn(train, lambda: calls.append("reset"))
    assert wrapped(RecordingState(calls), 21) == 42
    return calls


def test_a_failed_collective_restores_then_resets_then_syncs() -> None:
    assert run_with([MismatchError("shapes differ")]) == [
        "sync", "func", "restore", "reset", "state.reset", "callback", "sync", "func",
    ]  # fmt: skip


def test_hosts_updated_resets_without_restoring_and_skips_the_sync_only_when_asked() -> None:
    assert run_with([HostsUpdatedInterrupt(False)]) == [
        "sync", "func", "reset", "state.reset", "callback", "sync", "func",
    ]  # fmt: skip
    assert run_with([HostsUpdatedInterrupt(True)]) == [
        "sync", "func", "reset", "state.reset", "callback", "func",
    ]  # fmt: skip


def test_a_failure_after_a_skipped_sync_syncs_again() -> None:
    calls = run_with([HostsUpdatedInterrupt(True), InternalError("peer gone")])
    assert calls[-3:] == ["callback", "sync", "func"], calls


def test_other_exceptions_leave_the_loop() -> None:
    calls: list[str] = []

    def train(state: State) -> None:
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        run_fn(train, lambda: calls.append("reset"))(RecordingState(calls))
    assert calls == ["sync"]


#: What a rank's rejoin raises when the job driver stopped the job for its reset limit.
DRIVER_LIMIT = (
    "cannot join the job: job aborted: the number of resets of this elastic job exceeded its "
    "limit of 2 (--reset-limit 2); kolo stopped the job instead of resetting again"
)


def test_the_drivers_reset_limit_becomes_reset_limit_exceeded_from_its_error() -> None:
    """The driver keeps the one reset count (kolorun --reset-limit); a rank whose rejoin it
    refuses for the limit raises the typed error, not a RendezvousError."""
    calls: list[str] = []
    failures = [InternalError("first"), InternalError("second")]

    def train(state: State) -> None:
        raise failures.pop(0)

    def reset() -> None:
        calls.append("reset")
        if calls.count("reset") == 2:
            raise RendezvousError(DRIVER_LIMIT)

    with pytest.raises(ResetLimitExceededError, match="exceeded the limit: 2") as info:
        run_fn(train, reset)(RecordingState(calls))
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value.__cause__, RendezvousError)
    assert (info.value.limit, info.value.resets) == (2, 1)
    assert calls.count("reset") == 2 and calls[-2:] == ["restore", "reset"], calls


def test_other_rejoin_failures_pass_through() -> None:
    def train(state: State) -> None:
        raise InternalError("peer gone")

    def reset() -> None:
        raise RendezvousError("cannot join the job: the driver is gone")

    with pytest.raises(RendezvousError, match="driver is gone"):
        run_fn(train, reset)(RecordingState([]))


def test_reset_limit_exceeded_pickles() -> None:
    err = ResetLimitExceededError(3, 3)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is ResetLimitExceededError
    assert (clone.limit, clone.resets, str(clone)) == (3, 3, str(err))
