"""Where a ``kolo.spark.run`` launch spends its time (the launch report), and the first launch
of an application running no separate Spark job to check the executors' Python.

The functions run by the ranks are pickled by value (this module is not importable in the rank
processes), so each keeps its imports inside.
"""

from __future__ import annotations

import io
import pickle
import sys
import time

import cloudpickle
import pytest

import kolo.spark
from kolo._launch_times import (
    MAX_BYTES,
    PREFIX,
    RANK_STEPS,
    decode_rank_times,
    encode_rank_times,
    is_rank_times,
)
from kolo.spark import _python_probe
from kolo.spark._launch_report import PHASES, LaunchReport

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def chatty_fn():
    """Sends the driver one message of its own, returns its rank."""
    import os

    from kolo.spark.task import send_to_driver

    send_to_driver({"hello": int(os.environ["KOLO_RANK"])})
    return int(os.environ["KOLO_RANK"])


#: The phases of a launch whose ranks all started fresh (no warm rank server).
FRESH_PHASES = [name for name, _ in PHASES if name != "warm_fork"]


def test_launch_report_covers_every_phase_and_sums_to_its_total(spark, monkeypatch):
    """A launch hands its report to ``_on_launch_report``: every phase recorded (one host: all
    ranks report every step), none negative, in order, adding up to the time from the call to
    every rank's function starting, inside the call's own wall time; the ranks' launch-times
    messages never reach the user's ``_on_message``, which still gets its own messages. (Fresh
    rank processes; test_spark_warm_start.py covers the warm ones.)"""
    monkeypatch.setenv("KOLO_SPARK_WARM_START", "0")
    reports: list[LaunchReport] = []
    messages: list[tuple[int, object]] = []
    err = io.StringIO()
    before = time.time()
    results = kolo.spark.run(
        chatty_fn,
        num_proc=2,
        verbose=2,
        stderr=err,
        _on_message=lambda rank, obj: messages.append((rank, obj)),
        _on_launch_report=reports.append,
    )
    after = time.time()
    assert results == [0, 1]
    assert sorted(messages) == [(0, {"hello": 0}), (1, {"hello": 1})]
    (report,) = reports
    assert report.complete(), report
    assert sorted(report.tasks) == [0, 1] and sorted(report.ranks) == [0, 1]
    assert all(set(times) == set(RANK_STEPS) for times in report.ranks.values()), report.ranks
    phases = report.phases()
    assert [name for name, _ in phases] == FRESH_PHASES
    assert all(seconds >= 0 for _, seconds in phases), phases
    assert sum(seconds for _, seconds in phases) == pytest.approx(report.total(), abs=1e-6)
    points = report.milestones()
    assert before <= points[0][1] and points[-1][1] <= after
    assert 0 < report.total() <= after - before
    # Each rank passed its own steps in order.
    for times in report.ranks.values():
        stamps = [times[step] for step in RANK_STEPS[1:]]
        assert stamps == sorted(stamps), times
    assert f"kolo.spark.run: {report.describe()}" in err.getvalue()


@pytest.fixture
def probes(monkeypatch) -> list[int]:
    """The task counts of every executors'-Python probe job run from now on, with nothing
    remembered as checked yet (an application's first launch)."""
    counted: list[int] = []
    real_probe = _python_probe._run_probe

    def counted_probe(sc, num_tasks, timeout_s):
        counted.append(num_tasks)
        return real_probe(sc, num_tasks, timeout_s)

    monkeypatch.setattr(_python_probe, "_checked", set())
    monkeypatch.setattr(_python_probe, "_run_probe", counted_probe)
    return counted


def test_a_first_launch_runs_no_separate_probe_job_and_is_remembered(spark, probes):
    """The first launch of an application (no check of the executors' Python remembered)
    starts its stage without the probe job; once it ran, the executors' Python is remembered
    as working."""
    assert not _python_probe.executor_python_checked(spark)
    assert kolo.spark.run(chatty_fn, num_proc=2) == [0, 1]
    assert probes == []
    assert _python_probe.executor_python_checked(spark)


def failing_fn():
    raise ValueError("the user's own failure")


def test_a_failed_first_launch_keeps_its_own_error_when_the_executors_python_works(spark, probes):
    """A first launch that fails for another reason asks the executors' Python after the
    fact, finds it working, and raises the launch's own error."""
    from kolo.exceptions import RankFailedError

    with pytest.raises(RankFailedError, match="the user's own failure"):
        kolo.spark.run(failing_fn, num_proc=2)
    assert probes == [2]
    assert _python_probe.executor_python_checked(spark)


def test_launch_times_messages_are_told_from_user_messages_and_bounded():
    """A rank's launch-times message round-trips; a user's pickled message is never taken for
    one; malformed, oversized or non-finite contents give no times instead of an error."""
    times = {"interpreter": 1.5, "kolo_imported": 1.75, "joined": 2.0, "process": None}
    data = encode_rank_times(times)
    assert is_rank_times(data)
    assert decode_rank_times(data) == {"interpreter": 1.5, "kolo_imported": 1.75, "joined": 2.0}
    for obj in ({"hello": 0}, "text", b"\x00kolo-launch-times\x00", None):
        assert not is_rank_times(cloudpickle.dumps(obj))
        assert not is_rank_times(pickle.dumps(obj, protocol=2))
    assert decode_rank_times(PREFIX + b"not json") == {}
    assert decode_rank_times(PREFIX + b"[1, 2]") == {}
    assert decode_rank_times(PREFIX + b" " * MAX_BYTES + b"{}") == {}
    odd = PREFIX + b'{"joined": NaN, "interpreter": "1.0", "kolo_imported": true, "process": 3}'
    assert decode_rank_times(odd) == {"process": 3.0}


def test_a_rank_clock_behind_the_driver_gives_no_negative_phase():
    """Ranks on another host report their own clock: a clock behind the driver's (or a
    process creation time rounded down) makes a phase 0, never negative, and the phases still
    add up to the total."""
    report = LaunchReport(num_proc=2)
    report.driver.update({"called": 100.0, "service_starting": 100.1, "submitted": 100.2})
    report.tasks.update({0: 100.5, 1: 100.6})
    behind = {"process": 99.0, "interpreter": 99.1, "kolo_imported": 99.2, "joined": 99.3}
    report.ranks[0] = {**behind, "payload_loaded": 99.4}
    report.ranks[1] = {**behind, "payload_loaded": 101.0}
    phases = dict(report.phases())
    assert all(seconds >= 0 for seconds in phases.values()), phases
    assert phases["spark_scheduling"] == pytest.approx(0.4)
    assert phases["process_spawn"] == 0 and phases["rendezvous"] == 0
    assert phases["payload"] == pytest.approx(0.4)
    assert sum(phases.values()) == pytest.approx(report.total()) == pytest.approx(1.0)
    assert report.complete()
    del report.ranks[1]
    assert not report.complete() and "did not report" in report.describe()


def test_launch_report_on_spark_connect(connect_spark, monkeypatch):
    """On a Spark Connect session the tasks' start times come back through ``mapInArrow``'s
    rows (a double column): the report is as complete as on a classic session."""
    monkeypatch.setenv("KOLO_SPARK_WARM_START", "0")
    reports: list[LaunchReport] = []
    assert kolo.spark.run(
        chatty_fn, num_proc=2, spark=connect_spark, _on_launch_report=reports.append
    ) == [0, 1]
    (report,) = reports
    assert report.complete(), report
    phases = report.phases()
    assert [name for name, _ in phases] == FRESH_PHASES
    assert sum(seconds for _, seconds in phases) == pytest.approx(report.total(), abs=1e-6)
