"""kolo's Spark plugin (``jvm/``, ``kolo.spark.plugin``) on the shared standalone cluster: an
executor JVM SIGKILLed during ``kolo.spark.run`` fails the run with the executor, its host and
the cluster manager's reason, sooner than the job driver's own detection (task-runner watch and
heartbeats) does without the plugin; both times are printed.

The plugin's own behaviour (events, the bounded queue, a listener that never blocks) is proved
by its JUnit tests (jvm/src/test, run by dev/build-jvm.sh).

The functions below are pickled by value (this module is not importable in the rank
processes), so each keeps its imports inside.
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import cloudpickle
import pytest
from support.rank_marker import MARKER_VAR, assert_no_orphans, marked_pids
from test_spark_elastic import (
    KillRankAt,
    elastic_estimator,
    executor_id,
    executor_ids,
    executor_pid,
    grow_from_one_to_two,
    linear_rows,
    log_time,
    run_jobs_killing_executors,
)

import kolo.spark

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def train_until_stopped(report_dir):
    """Allreduces until stopped (at most 120 s); once training, each rank writes the pid of the
    executor JVM it runs under to ``report_dir`` (what ``run_jobs_killing_executors`` kills)."""
    import json
    import os

    import torch

    import kolo.torch as hvd

    hvd.init()
    path = os.path.join(report_dir, f"rank-{hvd.rank()}.json")
    deadline = time.monotonic() + 120
    step = 0
    while time.monotonic() < deadline:
        hvd.allreduce(torch.ones(1), op=hvd.Sum)
        if step == 1:
            with open(path + ".tmp", "w") as f:
                json.dump(
                    {"executor_pid": executor_pid(), "executor": executor_id(), "pid": os.getpid()},
                    f,
                )
            os.replace(path + ".tmp", path)
        step += 1
        time.sleep(0.02)
    return hvd.rank()


def error_value(error):
    """What the test needs of a launch's error, and when it was raised (wall clock)."""
    import time

    return {
        "raised_at": time.time(),
        "type": type(error).__name__,
        "message": str(error),
        "rank": getattr(error, "rank", None),
        "host": getattr(error, "host", None),
        "task_index": getattr(error, "task_index", None),
        "reason": getattr(error, "remote_traceback", None),
    }


def killed_fit_job(store_dir, report_dir, marker):
    """A ``TorchEstimator`` fit on two ranks (``kolo.spark.run``) whose rank 1 reports its
    executor JVM at epoch 1 for the test to kill; returns the error the fit raised."""

    def job(session):
        df = session.createDataFrame(linear_rows(), ["x", "y"])
        callback = KillRankAt(rank=1, epoch=1, report_dir=report_dir, step_s=0.03)
        backend = dict(num_proc=2, env={MARKER_VAR: marker})
        try:
            elastic_estimator(store_dir, backend, callback, epochs=8).fit(df)
        except Exception as error:
            return error_value(error)
        return {"raised_at": None}

    return job


def killed_run_job(report_dir, marker, use_plugin):
    """``kolo.spark.run`` on the two executors, one of which the test kills; returns the error
    it raised (its text and fields) and when it was raised (wall clock). Without
    ``use_plugin``, kolo ignores the plugin (``KOLO_SPARK_PLUGIN=0``) for the run."""

    def job(session):
        import os
        import time

        import kolo.spark

        deadline = time.monotonic() + 120
        while len(executor_ids(session)) < 2:
            assert time.monotonic() < deadline, "the second executor did not register"
            time.sleep(0.2)
        os.environ["KOLO_SPARK_PLUGIN"] = "1" if use_plugin else "0"
        try:
            kolo.spark.run(
                train_until_stopped,
                args=(report_dir,),
                num_proc=2,
                env={MARKER_VAR: marker},
            )
        except Exception as error:  # RankFailedError, or LaunchError when Spark's stage failed
            return error_value(error)
        finally:
            os.environ.pop("KOLO_SPARK_PLUGIN")
        return {"raised_at": None}

    return job


def scale_up_on_request_job(marker):
    """``run_elastic(num_proc=1, max_num_proc=2)`` on one executor (the other one killed
    first, which lowers the application's target); once a rank trains, one more executor is
    requested: it is added while the second task waits for a slot."""

    def job(session):
        import threading
        import time

        jsc = session.sparkContext._jsc.sc()
        deadline = time.monotonic() + 120
        while len(executor_ids(session)) < 2:
            assert time.monotonic() < deadline, "the second executor did not register"
            time.sleep(0.2)
        jsc.killExecutor(executor_ids(session)[-1])
        while len(executor_ids(session)) > 1:
            assert time.monotonic() < deadline, "the killed executor did not go"
            time.sleep(0.2)
        before = executor_ids(session)

        def add_an_executor():
            while not marked_pids(marker) and time.monotonic() < deadline:
                time.sleep(0.1)
            # Without dynamic allocation Spark's target after killExecutor is 0 (it never
            # counted the first executors); spark.cores.max=2 caps the application at two.
            jsc.requestExecutors(2)

        threading.Thread(target=add_an_executor, daemon=True).start()
        return grow_from_one_to_two(session, marker, before)

    return job


@pytest.fixture(scope="module")
def killed_runs(standalone_cluster, tmp_path_factory):
    """One Spark application with the plugin on the standalone cluster (two executors of one
    core each, one per simulated host) runs the scale-up job of :func:`scale_up_on_request_job`,
    then ``kolo.spark.run`` twice, SIGKILLing rank 1's executor JVM once both ranks train: first
    with kolo ignoring the plugin (``KOLO_SPARK_PLUGIN=0``: the path without the jar), then
    using it (Standalone replaces the killed executor in between). Yields, per run (keyed by
    whether it used the plugin), the error raised, the seconds from the kill to that error, the
    killed executor's id; the scale-up job's value and the driver's log."""
    if kolo.spark.jar_path() is None:
        pytest.skip("kolo's Spark plugin jar is not built (dev/build-jvm.sh)")
    marker = uuid.uuid4().hex
    tmp_path = tmp_path_factory.mktemp("plugin")
    reports = [tmp_path / "reports-without", tmp_path / "reports-with", tmp_path / "reports-fit"]
    for report_dir in reports:
        report_dir.mkdir()
    jobs = [
        scale_up_on_request_job(marker),
        killed_run_job(str(reports[0]), marker, use_plugin=False),
        killed_run_job(str(reports[1]), marker, use_plugin=True),
        killed_fit_job(str(tmp_path / "store"), str(reports[2]), marker),
    ]
    values, _, kill_times, log = run_jobs_killing_executors(
        standalone_cluster, tmp_path, jobs, [None, *reports], plugin=True, dynamic_allocation=False
    )
    assert_no_orphans(marker)
    runs = {"scale_up": values[0], "log": log, "fit": values[3]}
    noticed = [
        log_time(line)
        for line in log.splitlines()
        if "kolo.spark.run: Spark executor" in line and "was lost" in line
    ]
    for plugin, error, killed, report_dir in zip((False, True), values[1:], kill_times, reports):
        assert error["raised_at"] is not None, f"the run did not fail:\n{log[-5000:]}"
        print(f"plugin={plugin}: {error['type']}: {error['message'][:600]}")
        runs[plugin] = {
            "error": error,
            "seconds": error["raised_at"] - killed,
            "executor": json.loads((report_dir / "rank-1.json").read_text())["executor"],
        }
    assert len(noticed) == 2, log[-6000:]  # the run with the plugin, and the fit
    print(
        "kill -9 of an executor JVM -> kolo.spark.run's error: "
        f"{runs[False]['seconds']:.2f}s without the plugin (task-runner watch / heartbeats), "
        f"{runs[True]['seconds']:.2f}s with it (Spark's executor-lost event, in the driver's "
        f"log {noticed[0] - kill_times[1]:.2f}s after the kill); the fit's "
        f"{runs['fit']['raised_at'] - kill_times[2]:.2f}s"
    )
    yield runs


def test_a_killed_executor_fails_the_run_naming_executor_host_and_reason(killed_runs):
    """With the plugin, the error says which executor Spark lost, on which host, and why (the
    standalone Worker's report of the JVM's exit status: 137 is SIGKILL)."""
    run = killed_runs[True]
    error, executor = run["error"], run["executor"]
    assert executor is not None
    message = error["message"]
    assert f"Spark executor {executor} on host 127.0.0.1 was lost" in message, message
    assert "137" in error["reason"] or "killed" in error["reason"].lower(), error
    assert error["type"] == "RankFailedError" and error["host"] == "127.0.0.1", error
    assert error["rank"] == 1 and error["task_index"] is not None, error


def test_a_killed_executor_fails_a_fit_naming_executor_host_and_reason(killed_runs):
    """The estimators launch through ``kolo.spark.run``: a fit whose executor is SIGKILLed
    fails with the same explained error."""
    error = killed_runs["fit"]
    assert error["raised_at"] is not None and error["type"] == "RankFailedError", error
    assert "on host 127.0.0.1 was lost: Command exited with code 137" in error["message"], error
    assert error["rank"] == 1 and error["host"] == "127.0.0.1", error


def test_the_plugin_reports_the_loss_sooner_than_the_heartbeat_path(killed_runs):
    """Without the plugin the run still fails (the job driver's own detection, or Spark's failed
    stage), without naming the lost executor; with it, sooner."""
    without, with_plugin = killed_runs[False], killed_runs[True]
    assert without["error"]["type"] in ("RankFailedError", "LaunchError"), without["error"]
    assert "was lost" not in without["error"]["message"], without["error"]
    assert with_plugin["seconds"] < without["seconds"], (with_plugin, without)
    # Without the plugin the lost task runner's watch (1.2 s grace) ends the wait for its exit:
    # the launch does not sit out the 15 s stop wait (STOP_WAIT_S) for an exit that never comes.
    assert without["seconds"] < 10, without


def test_without_the_jar_on_the_driver_nothing_is_attached(spark):
    """The suite's session has no plugin on its classpath: kolo finds no plugin class and opens
    no event stream (``kolo.spark.run`` works as before, as the other Spark tests show)."""
    from kolo.spark._jvm_events import events_class, open_job_events

    sc = spark.sparkContext
    assert events_class(sc) is None
    assert open_job_events(sc, lambda: "kolo.spark.run-x") is None


def test_configure_adds_the_jar_and_plugin_keeping_what_is_set():
    from pyspark.sql import SparkSession

    import kolo.spark.plugin

    jar = kolo.spark.jar_path()
    if jar is None:
        pytest.skip("kolo's Spark plugin jar is not built (dev/build-jvm.sh)")
    builder = (
        SparkSession.Builder()
        .config("spark.jars", "/opt/other.jar")
        .config("spark.plugins", "com.example.Plugin")
    )
    kolo.spark.plugin.configure(builder)
    kolo.spark.plugin.configure(builder)  # twice: nothing added twice
    options = builder._options
    assert options["spark.jars"] == f"/opt/other.jar,{jar}"
    assert options["spark.plugins"] == f"com.example.Plugin,{kolo.spark.plugin.PLUGIN_CLASS}"
    assert options["spark.driver.extraClassPath"] == jar
    assert jar.endswith("kolo/spark/jars/kolo-spark.jar")


def test_an_executor_added_while_an_elastic_run_waits_is_a_discovery_event(killed_runs):
    """With the plugin, ``run_elastic``'s driver hears of the executor Spark added while its
    second task waited for a slot (logged, counted in the launch summary), and the task that
    started there joined."""
    value, log = killed_runs["scale_up"], killed_runs["log"]
    results = value["results"]
    assert len(value["before"]) == 1 and [r["size"] for r in results] == [2, 2], value
    added = [e for e in value["after"] if e not in value["before"]]
    assert added, value
    lines = [line for line in log.splitlines() if "discovery: executor" in line]
    assert any(f"executor {e} added on host 127.0.0.1" in line for e in added for line in lines), (
        log[-6000:]
    )
    summary = [line for line in log.splitlines() if "rank(s) finished in" in line]
    assert summary and "discovery: 1 executor(s) added" in summary[0], summary
