"""The decision ``State.check_host_updates`` takes on the driver's host updates (the pure part;
the 2-rank agreement through rank 0's broadcast is in tests/test_elastic.py)."""

from __future__ import annotations

import pytest

from kolo.elastic import HostUpdateResult
from kolo.elastic._notifications import host_update_interrupt, newest_host_update
from kolo.exceptions import HostsUpdatedInterrupt

REMOVED, ADDED, MIXED = HostUpdateResult.removed, HostUpdateResult.added, HostUpdateResult.mixed


def test_no_update_keeps_the_last_timestamp() -> None:
    assert newest_host_update(7.0, []) == (7.0, HostUpdateResult.no_update)


def test_updates_at_or_before_the_last_one_handled_are_ignored() -> None:
    assert newest_host_update(10.0, [(9.0, ADDED), (10.0, REMOVED)]) == (
        10.0,
        HostUpdateResult.no_update,
    )


def test_newer_updates_give_the_newest_timestamp_and_the_union_of_changes() -> None:
    # Out of order, as notices may arrive; the old one does not count.
    timestamp, changed = newest_host_update(10.0, [(12.0, REMOVED), (5.0, ADDED), (11.0, REMOVED)])
    assert (timestamp, changed) == (12.0, REMOVED)
    timestamp, changed = newest_host_update(10.0, [(12.0, REMOVED), (11.0, 2)])
    assert (timestamp, changed) == (12.0, MIXED)
    assert isinstance(changed, HostUpdateResult)


def test_the_engines_plain_ints_are_accepted() -> None:
    assert newest_host_update(0.0, [(1.5, 1), (2.5, 3)]) == (2.5, MIXED)


def test_nothing_newer_raises_nothing() -> None:
    assert host_update_interrupt(10.0, 10.0, int(REMOVED)) is None


@pytest.mark.parametrize(
    ("changed", "skip_sync"),
    [(REMOVED, True), (ADDED, False), (MIXED, False), (HostUpdateResult.no_update, False)],
)
def test_only_a_pure_removal_skips_the_sync(changed: HostUpdateResult, skip_sync: bool) -> None:
    interrupt = host_update_interrupt(10.0, 11.0, int(changed))
    assert isinstance(interrupt, HostsUpdatedInterrupt)
    assert interrupt.skip_sync is skip_sync
