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
    InvalidArgumentError,
    MismatchError,
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


def run_with(failures: list[BaseException], reset_limit: int | None = None) -> list[str]:
    calls: list[str] = []
    pending = list(failures)

    def train(state: State, value: int) -> int:
        calls.append("func")
        if pending:
            raise pending.pop(0)
        return value * 2

    wrapped = run_fn(train, lambda: calls.append("reset"), reset_limit=reset_limit)
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


def test_the_reset_limit_allows_that_many_resets_then_raises_from_the_cause() -> None:
    assert run_with([InternalError("a"), InternalError("b")], reset_limit=2).count("reset") == 2
    calls: list[str] = []
    failures = [InternalError("first"), MismatchError("second")]

    def train(state: State) -> None:
        raise failures.pop(0)

    with pytest.raises(ResetLimitExceededError, match="exceeded the limit: 1") as info:
        run_fn(train, lambda: calls.append("reset"), reset_limit=1)(RecordingState(calls))
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value.__cause__, MismatchError)
    assert calls.count("reset") == 1 and calls[-1] == "restore", calls


def test_a_reset_limit_of_zero_allows_no_reset(monkeypatch) -> None:
    monkeypatch.setenv("KOLO_RESET_LIMIT", "0")
    calls: list[str] = []

    def train(state: State) -> None:
        raise HostsUpdatedInterrupt(False)

    with pytest.raises(ResetLimitExceededError) as info:
        run_fn(train, lambda: calls.append("reset"))(RecordingState(calls))
    assert "reset" not in calls and info.value.limit == 0


@pytest.mark.parametrize("raw", ["-1", "two", "1.5"])
def test_a_bad_reset_limit_is_a_typed_error(monkeypatch, raw: str) -> None:
    monkeypatch.setenv("KOLO_RESET_LIMIT", raw)
    wrapped = run_fn(lambda state: None, lambda: None)
    with pytest.raises(InvalidArgumentError, match="KOLO_RESET_LIMIT"):
        wrapped(RecordingState([]))
    with pytest.raises(InvalidArgumentError, match="reset_limit=-2"):
        run_fn(lambda state: None, lambda: None, reset_limit=-2)


def test_reset_limit_exceeded_pickles() -> None:
    err = ResetLimitExceededError(3, 3)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is ResetLimitExceededError
    assert (clone.limit, clone.resets, str(clone)) == (3, 3, str(err))
