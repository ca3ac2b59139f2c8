"""``kolo.spark.run_elastic`` and an elastic ``TorchEstimator`` fit on real Spark: local[2] (the
session fixture) and the shared standalone cluster, where an executor JVM is killed with
SIGKILL mid-training and the job finishes on a replacement.

The functions below are pickled by value (this module is not importable in the rank
processes), so each keeps its imports inside.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest
from support.rank_marker import MARKER_VAR, assert_no_orphans
from support.shm_segments import leftovers, segments

import kolo.spark
from kolo.exceptions import ConfigError, InvalidArgumentError, RankFailedError

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]
#: A line of the driver's ``kolo.spark`` log, with its time (``%(asctime)s``); a rank's output
#: may have been written into the same line before it.
KOLO_SPARK_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) kolo\.spark ")


def next_job_id(spark) -> int:
    """The id the next Spark job of this context gets (counts every job ever started)."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def executor_pid():
    """The pid of the executor JVM this process runs under (None in local mode)."""
    import os

    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"CoarseGrainedExecutorBackend" in f.read():
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return None


def executor_id(pid=None):
    """The Spark executor id of the executor JVM ``pid`` (default: the one this process runs
    under; None in local mode)."""
    pid = executor_pid() if pid is None else pid
    if pid is None:
        return None
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().decode().split("\0")
    return args[args.index("--executor-id") + 1] if "--executor-id" in args else None


def elastic_steps(steps, step_s, report_dir=None, die_rank=None, grow_to=None):
    """An elastic loop of ``steps`` committed steps of one allreduce each; the state keeps the
    size every step ran at. With ``report_dir``, each rank writes the pid of the executor JVM
    it runs under once it is training; with ``die_rank``, that rank of the first round
    SIGKILLs itself at step 2; with ``grow_to``, it also keeps stepping (at most 600 steps)
    until a step ran at that size, so a slow joiner cannot miss the job."""
    import json
    import os
    import signal
    import time

    import torch

    import kolo.torch as hvd

    hvd.init()
    resets = []
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, sizes=[])
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        def more() -> bool:
            if state.step < steps:
                return True
            grown = grow_to is None or (state.sizes and state.sizes[-1] >= grow_to)
            return not grown and state.step < 600

        while more():
            if report_dir and state.step == 1 and not resets:
                path = os.path.join(report_dir, f"rank-{hvd.rank()}.json")
                with open(path + ".tmp", "w") as f:
                    json.dump({"executor_pid": executor_pid(), "pid": os.getpid()}, f)
                os.replace(path + ".tmp", path)
            if die_rank is not None and hvd.rank() == die_rank and state.step == 2 and not resets:
                os.kill(os.getpid(), signal.SIGKILL)
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            time.sleep(step_s)
            state.sizes = [*state.sizes, int(total.item())]
            state.step += 1
            state.commit()
        return {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "task": int(os.environ["KOLO_TASK_INDEX"]),
            "joining": os.environ.get("KOLO_ELASTIC_JOINING") == "1",
            "executor": executor_id(),
            "step": state.step,
            "sizes": state.sizes,
            "resets": resets,
        }

    return train(state)


def test_a_rank_killed_leaves_and_the_survivor_finishes(spark):
    """local[2]: rank 1 SIGKILLs itself mid-training; rank 0 restores its last commit and
    finishes alone (min_num_proc=1); no rank process or shared-memory segment is left."""
    marker = uuid.uuid4().hex
    segments_before = segments()
    started = time.monotonic()
    results = kolo.spark.run_elastic(
        elastic_steps,
        kwargs={"steps": 8, "step_s": 0.05, "die_rank": 1},
        num_proc=2,
        min_num_proc=1,
        env={MARKER_VAR: marker},
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    elapsed = time.monotonic() - started
    assert len(results) == 1, results
    (result,) = results
    assert result["rank"] == 0 and result["size"] == 1
    assert result["step"] == 8 and len(result["sizes"]) == 8
    # Two steps ran on two ranks before the kill, the rest on the survivor alone.
    assert result["sizes"][:2] == [2, 2] and set(result["sizes"][2:]) == {1}, result
    assert result["resets"] == [1]
    assert_no_orphans(marker, within=15.0)
    assert not leftovers(segments_before)
    print(f"run_elastic local[2], one rank killed: {elapsed:.2f}s")


def test_a_task_past_num_proc_is_admitted_and_joins(spark):
    """num_proc=1, max_num_proc=2 on local[2]: Spark starts both tasks; task 1 is not a member
    of the first round, announces itself, is admitted (add_tasks) and joins, so the job ends
    on two ranks that agree on the state."""
    marker = uuid.uuid4().hex
    results = kolo.spark.run_elastic(
        elastic_steps,
        kwargs={"steps": 12, "step_s": 0.1, "grow_to": 2},
        num_proc=1,
        max_num_proc=2,
        env={MARKER_VAR: marker},
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    assert [r["rank"] for r in results] == [0, 1], results
    assert sorted(r["task"] for r in results) == [0, 1]
    assert all(r["size"] == 2 and r["step"] == results[0]["step"] >= 12 for r in results), results
    assert results[0]["sizes"] == results[1]["sizes"] and results[0]["sizes"][-1] == 2
    assert_no_orphans(marker, within=15.0)


def test_the_reset_past_reset_limit_stops_the_job(spark):
    marker = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(RankFailedError, match="exceeded its limit of 0") as caught:
        kolo.spark.run_elastic(
            elastic_steps,
            kwargs={"steps": 8, "step_s": 0.05, "die_rank": 1},
            num_proc=2,
            min_num_proc=1,
            reset_limit=0,
            env={MARKER_VAR: marker},
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert time.monotonic() - started < 60
    assert "reset" in str(caught.value)
    assert_no_orphans(marker, within=15.0)


def raising_elastic_fn(marker):
    import time

    import kolo.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        time.sleep(0.3)
        raise ValueError(f"boom {marker}")
    time.sleep(120)


def test_a_raising_function_fails_the_job_fast(spark):
    marker = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        kolo.spark.run_elastic(
            raising_elastic_fn,
            args=(marker,),
            num_proc=2,
            min_num_proc=1,
            env={MARKER_VAR: marker},
            stderr=io.StringIO(),
        )
    assert time.monotonic() - started < 30
    assert caught.value.rank == 1
    assert f"ValueError: boom {marker}" in caught.value.remote_traceback
    assert_no_orphans(marker, within=15.0)


def test_bad_arguments_are_typed_errors_before_any_spark_job(spark):
    run = kolo.spark.run_elastic
    jobs_before = next_job_id(spark)
    cases = [
        (dict(num_proc=0), "num_proc"),
        (dict(num_proc=2, min_num_proc=0), "min_num_proc"),
        (dict(num_proc=2, max_num_proc="3"), "max_num_proc"),
        (dict(num_proc=2, min_num_proc=3), "min_num_proc <= num_proc <= max_num_proc"),
        (dict(num_proc=2, max_num_proc=1), "min_num_proc <= num_proc <= max_num_proc"),
        (dict(num_proc=2, elastic_timeout=-1), "elastic_timeout"),
        (dict(num_proc=2, elastic_timeout=float("nan")), "elastic_timeout"),
        (dict(num_proc=2, reset_limit=-1), "reset_limit"),
        (dict(num_proc=2, reset_limit=1.5), "reset_limit"),
        (dict(num_proc=2, start_timeout=0), "start_timeout"),
        (dict(num_proc=2, env={"A": 1}), "env"),
    ]
    for kwargs, match in cases:
        with pytest.raises(InvalidArgumentError, match=match):
            run(elastic_steps, **kwargs)
    with pytest.raises(InvalidArgumentError, match="callable"):
        run("not a function", num_proc=1)
    with pytest.warns(DeprecationWarning, match="min_np is deprecated"):
        with pytest.raises(InvalidArgumentError, match="min_num_proc"):
            run(elastic_steps, num_proc=2, min_np=5)
    from kolo.spark.common.backend import SparkBackend

    with pytest.raises(InvalidArgumentError, match=r"'use_mpi', which kolo.spark.run_elastic"):
        SparkBackend(num_proc=2, min_num_proc=1, use_mpi=True)
    conf = spark.sparkContext._conf
    conf.set("spark.speculation", "true")
    try:
        with pytest.raises(ConfigError, match=r"spark\.speculation"):
            run(elastic_steps, num_proc=2)
    finally:
        conf.set("spark.speculation", "false")
    assert next_job_id(spark) == jobs_before, "a Spark job ran before the arguments were checked"


#: ``horovod.spark.run_elastic``'s parameters in Horovod 0.28.1's order.
HOROVOD_RUN_ELASTIC_PARAMS = [
    "fn",
    "args",
    "kwargs",
    "num_proc",
    "min_num_proc",
    "max_num_proc",
    "start_timeout",
    "elastic_timeout",
    "reset_limit",
    "env",
    "stdout",
    "stderr",
    "verbose",
    "nics",
    "prefix_output_with_timestamp",
    "min_np",
    "max_np",
]


def test_signature_is_horovods_in_order():
    import inspect

    from kolo.spark.runner import run_elastic

    params = inspect.signature(kolo.spark.run_elastic).parameters
    positional = [
        name for name, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    assert positional == HOROVOD_RUN_ELASTIC_PARAMS
    assert run_elastic is kolo.spark.run_elastic


STANDALONE_DRIVER = r"""
import json, logging, sys, time
sys.path.insert(0, sys.argv[2])
import cloudpickle
from support.spark import local_session_builder

import os
import kolo.spark.plugin

logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
logging.getLogger("kolo.spark").setLevel(logging.INFO)
with open(sys.argv[3], "rb") as f:
    jobs = cloudpickle.load(f)
builder = local_session_builder(sys.argv[1])
if os.environ.get("KOLO_TEST_SPARK_PLUGIN") == "1":  # kolo's Spark plugin (jvm/)
    builder = kolo.spark.plugin.configure(builder)
# Dynamic allocation from one executor of one core up to two: each rank has its own executor
# JVM, an executor is added for a task that waits for a slot (the scale-up job), and the retry
# of a killed rank's task waits for the executor started in its place (seconds), so the job
# driver's own detection of the loss (about a second) always comes first.
builder = builder.config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
if os.environ.get("KOLO_TEST_DYNAMIC_ALLOCATION") == "0":  # two executors (a barrier stage)
    builder = builder.config("spark.cores.max", "2")
    dynamic = {}
else:
    dynamic = {
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "1",
        "spark.dynamicAllocation.initialExecutors": "1",
        "spark.dynamicAllocation.maxExecutors": "2",
        "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
    }
for key, value in dynamic.items():
    builder = builder.config(key, value)
session = builder.getOrCreate()
session.sparkContext.setLogLevel("ERROR")
deadline = time.monotonic() + 120
while not session.sparkContext._jsc.sc().getExecutorIds().nonEmpty():
    assert time.monotonic() < deadline, "the first executor did not register"
    time.sleep(0.2)
for index, job in enumerate(jobs):
    print(f"RESULT {index} " + json.dumps(job(session)), flush=True)
session.stop()
"""


def executor_ids(session) -> list[str]:
    """The ids of the application's executors now."""
    ids = session.sparkContext._jsc.sc().getExecutorIds().mkString(",")
    return sorted(ids.split(",")) if ids else []


def executor_jvm(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def run_jobs_killing_executors(
    standalone_cluster, tmp_path, jobs, report_dirs, plugin=False, dynamic_allocation=True
):
    """Runs ``jobs`` (each ``job(session) -> JSON value``) one after the other in one Spark
    application on the standalone cluster (one core per executor, so each rank has its own
    executor JVM). During job ``i``, once ranks 0 and 1 wrote their executor's pid to
    ``report_dirs[i]`` (None: no kill), SIGKILLs rank 1's executor JVM. Returns each job's
    value, the seconds from each kill (or job start) to its job's end, the wall-clock time of
    each kill, and the driver's stderr (its ``kolo.spark`` log). With ``plugin``, the session
    has kolo's Spark plugin (``kolo.spark.plugin.configure``); without ``dynamic_allocation``,
    two executors from the start (a barrier stage cannot run under dynamic allocation)."""
    import queue
    import threading

    path = tmp_path / "jobs.pkl"
    path.write_bytes(cloudpickle.dumps(jobs))
    script = tmp_path / "driver.py"
    script.write_text(STANDALONE_DRIVER)
    env = dict(
        os.environ,
        KOLO_HEARTBEAT_TIMEOUT_SECONDS="15",
        KOLO_TEST_SPARK_PLUGIN=str(int(plugin)),
        KOLO_TEST_DYNAMIC_ALLOCATION=str(int(dynamic_allocation)),
    )
    driver = subprocess.Popen(
        [sys.executable, str(script), standalone_cluster, str(REPO / "tests"), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda: [lines.put(line) for line in driver.stdout], daemon=True),
        threading.Thread(target=lambda: err.extend(driver.stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    values, after_kill, kill_times = [], [], []
    try:
        for index, report_dir in enumerate(report_dirs):
            killed = time.monotonic()
            if report_dir is not None:
                reports = [report_dir / f"rank-{rank}.json" for rank in (0, 1)]
                deadline = time.monotonic() + 180
                while not all(path.exists() for path in reports):
                    assert driver.poll() is None, "".join(err)[-8000:]
                    assert time.monotonic() < deadline, "the ranks never started training"
                    time.sleep(0.05)
                pids = [json.loads(path.read_text())["executor_pid"] for path in reports]
                assert pids[0] != pids[1] and all(pids), pids
                assert b"CoarseGrainedExecutorBackend" in executor_jvm(pids[1])
                os.kill(pids[1], signal.SIGKILL)
                killed = time.monotonic()
                kill_times.append(time.time())
            while True:
                try:
                    line = lines.get(timeout=240)
                except queue.Empty:
                    raise AssertionError("".join(err)[-8000:]) from None
                if line.startswith(f"RESULT {index} "):
                    break
            after_kill.append(time.monotonic() - killed)
            values.append(json.loads(line[len(f"RESULT {index} ") :]))
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for reader in readers:
            reader.join(timeout=10)
    assert driver.returncode == 0, "".join(err)[-8000:]
    return values, after_kill, kill_times, "".join(err)


def run_elastic_job(report_dir, marker, steps):
    def job(session):
        import kolo.spark

        return kolo.spark.run_elastic(
            elastic_steps,
            kwargs={"steps": steps, "step_s": 0.2, "report_dir": report_dir, "grow_to": 2},
            num_proc=2,
            min_num_proc=1,
            env={MARKER_VAR: marker},
        )

    return job


def fit_job(store_dir, report_dir, marker, epochs):
    def job(session):
        df = session.createDataFrame(linear_rows(), ["x", "y"])
        est = elastic_estimator(
            store_dir,
            dict(num_proc=2, min_num_proc=1, env={MARKER_VAR: marker}),
            KillRankAt(rank=1, epoch=1, report_dir=report_dir, step_s=0.03),
            epochs=epochs,
        )
        fitted = est.fit(df)
        column = fitted.getOutputCols()[0]
        rows = fitted.transform(session.createDataFrame(linear_rows(16), ["x", "y"])).collect()
        return {
            "history": fitted.getHistory(),
            "errors": [abs(float(row[column]) - row["y"]) for row in rows],
        }

    return job


def grow_from_one_to_two(session, marker, before) -> dict:
    """``run_elastic(num_proc=1, max_num_proc=2)`` until a step ran on two ranks; the
    executors ``before`` (given) and after, and the ranks' results."""
    import kolo.spark

    results = kolo.spark.run_elastic(
        elastic_steps,
        kwargs={"steps": 5, "step_s": 0.1, "grow_to": 2},
        num_proc=1,
        min_num_proc=1,
        max_num_proc=2,
        env={MARKER_VAR: marker},
    )
    return {"before": before, "after": executor_ids(session), "results": results}


def scale_up_job(marker):
    """``run_elastic(num_proc=1, max_num_proc=2)`` with the executors before and after."""

    def job(session):
        return grow_from_one_to_two(session, marker, executor_ids(session))

    return job


@pytest.fixture(scope="module")
def standalone_runs(standalone_cluster, tmp_path_factory):
    """One Spark application with dynamic allocation (one executor of one core at first, two
    at most) on the standalone cluster runs three jobs: a scale-up, then a ``run_elastic`` and
    an elastic ``TorchEstimator`` fit during each of which rank 1's executor JVM is SIGKILLed.
    Yields the jobs' values, the wall-clock time of each kill, the seconds from each kill to its
    job's end, the driver's log, and the test processes' marker and shared-memory segments."""
    tmp_path = tmp_path_factory.mktemp("standalone-runs")
    marker = uuid.uuid4().hex
    segments_before = segments()
    reports = [tmp_path / "reports-run", tmp_path / "reports-fit"]
    for report_dir in reports:
        report_dir.mkdir()
    jobs = [
        scale_up_job(marker),
        run_elastic_job(str(reports[0]), marker, STEPS),
        fit_job(str(tmp_path / "store"), str(reports[1]), marker, EPOCHS),
    ]
    values, after_kill, kill_times, log = run_jobs_killing_executors(
        standalone_cluster, tmp_path, jobs, [None, *reports]
    )
    print("\n".join(line for line in log.splitlines() if "kolo.spark " in line))
    assert_no_orphans(marker, within=15.0)
    assert not leftovers(segments_before)
    yield {
        "values": values,
        "kill_times": kill_times,
        "after_kill": after_kill[1:],
        "log": log,
    }


#: Steps of the killed run_elastic job and epochs of the killed fit.
STEPS, EPOCHS = 4, 4


def test_dynamic_allocation_grows_the_job(standalone_runs):
    """Scale-up through Spark dynamic allocation: the application has one executor of one
    core when ``run_elastic(num_proc=1, max_num_proc=2)`` starts, so training starts on one
    rank while the second task waits for a slot. Dynamic allocation sees the pending task and
    adds an executor; the task starts there, is admitted and joins as a new worker: rank 0 sees
    the host added, resets, and the job finishes on two ranks (on two executors, the second one
    added during the job) that agree on the state. No rank process is left (the fixture)."""
    value = standalone_runs["values"][0]
    results = value["results"]
    assert len(value["before"]) == 1, value
    assert [r["rank"] for r in results] == [0, 1], results
    assert sorted(r["task"] for r in results) == [0, 1], results
    # Only the worker that joined a running job warmed its framework up before registering.
    assert [r["joining"] for r in results] == [False, True], results
    executors = [r["executor"] for r in results]
    assert executors[0] in value["before"] and executors[1] not in value["before"], value
    assert executors[1] in value["after"], value
    # Training started on one rank and grew to two; both ranks hold rank 0's state.
    assert all(r["size"] == 2 and r["step"] == results[0]["step"] for r in results), results
    sizes = results[0]["sizes"]
    assert results[1]["sizes"] == sizes and sizes[0] == 1 and sizes[-1] == 2, results
    assert sorted(sizes) == sizes, sizes  # grew once, never shrank
    first_kill = standalone_runs["kill_times"][0]
    joins = [
        line
        for line in standalone_runs["log"].splitlines()
        if "joins the job" in line and log_time(line) < first_kill
    ]
    assert len(joins) == 1 and "task 1 (partition 1, attempt 0)" in joins[0], joins
    print(f"dynamic allocation: grew 1 -> 2 after {sizes.count(1)} step(s)")


def test_standalone_survives_killed_executor_jvms(standalone_runs):
    """On the standalone cluster, an executor JVM is SIGKILLed mid-training, twice:

    (a) under ``run_elastic``: the job driver notices within seconds that the task runner died
    with the executor, its rank leaves, the survivor restores its last commit and trains alone;
    Spark retries the task on a new executor (attempt 1 = task index partition + 2), the retry
    joins as a new worker, and both finish with the same state;
    (b) during an elastic ``TorchEstimator`` fit: the same (the fit may end on the survivor
    before the retry joins), and the fit ends with all its epochs and a model that transforms.

    No rank process or shared-memory segment is left afterwards (the fixture)."""
    _, results, fit = standalone_runs["values"]
    kill_times, log = standalone_runs["kill_times"], standalone_runs["log"]
    steps, epochs = STEPS, EPOCHS
    print(json.dumps(results))
    # (a)
    assert [r["rank"] for r in results] == [0, 1], results
    assert all(r["size"] == 2 and r["step"] == results[0]["step"] >= steps for r in results), (
        results
    )
    # The survivor (an attempt-0 task) and the retry of the killed one (attempt 1).
    tasks = sorted(r["task"] for r in results)
    assert tasks[0] in (0, 1) and tasks[1] in (2, 3), tasks
    assert [r["joining"] for r in sorted(results, key=lambda r: r["task"])] == [False, True]
    # The state is rank 0's on both (the retry synced it); every committed step ran once: on
    # two ranks, then on the survivor alone (it went on as soon as the loss was noticed, not
    # when Spark's retry started), then on two again after the retry joined.
    sizes = results[0]["sizes"]
    assert results[1]["sizes"] == sizes and len(sizes) == results[0]["step"] >= steps, results
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes
    survivor = next(r for r in results if r["task"] < 2)
    assert survivor["resets"] and survivor["resets"][-1] == 2, survivor
    # (b)
    assert len(fit["history"]["train_loss"]) == epochs, fit
    assert fit["history"]["train_loss"][-1] < fit["history"]["train_loss"][0], fit
    assert len(fit["errors"]) == 16 and max(fit["errors"]) < 1.0, fit
    # The run's retry joined; the fit's may come after the fit ended on the survivor alone.
    joins = [
        line
        for line in log.splitlines()
        if "joins the job" in line and kill_times[0] < log_time(line) < float("inf")
    ]
    assert 1 <= len(joins) <= 2, log[-6000:]
    # Each loss was noticed from the task runner's watch (its executor died with it), not from
    # Spark's retry of the task or the heartbeat timeout, and within a few seconds.
    detected = [loss_noticed(log, killed) for killed in kill_times]
    for seconds, lines in detected:
        assert "Spark started attempt" not in lines[0], lines
        assert any("was lost with its task runner" in line for line in lines), lines
        assert seconds < 5.0, (seconds, lines)
    run_s, fit_s = standalone_runs["after_kill"]
    print(
        f"standalone: executor JVM SIGKILLed; loss noticed {detected[0][0]:.2f}s and "
        f"{detected[1][0]:.2f}s later; run_elastic done {run_s:.1f}s later, fit {fit_s:.1f}s"
    )


def log_time(line: str) -> float:
    """The wall-clock time of a ``kolo.spark`` log line (infinity for other lines)."""
    from datetime import datetime

    found = KOLO_SPARK_LINE.search(line)
    if found is None:
        return float("inf")
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def loss_noticed(log: str, killed: float) -> tuple[float, list[str]]:
    """How many seconds after the wall-clock time ``killed`` the driver's ``kolo.spark`` log
    first said a task left the job, and its lines about tasks leaving and joining from there up
    to the first join."""
    lines = []
    for line in log.splitlines():
        if not any(
            what in line for what in ("left the job", "continue without it", "joins the job")
        ):
            continue
        stamp = log_time(line)
        if not killed <= stamp < float("inf"):
            continue
        if not lines:
            first = stamp
        lines.append(line)
        if "joins the job" in line:
            break
    assert lines and "joins the job" not in lines[0], log[-6000:]
    return first - killed, lines


class KillRankAt:
    """A TorchEstimator callback: at ``epoch``'s first batch, rank ``rank`` of the first round
    SIGKILLs itself (``report_dir``: instead, write the executor JVM's pid and slow the epoch
    down so the test can kill that JVM)."""

    def __init__(self, rank, epoch, report_dir=None, step_s=0.0):
        self.rank, self.epoch, self.report_dir, self.step_s = rank, epoch, report_dir, step_s
        self.armed = True

    def on_train_batch_end(self, step, logs):
        import json
        import os
        import signal
        import time

        import kolo.torch as hvd

        time.sleep(self.step_s)
        if not self.armed or logs["epoch"] != self.epoch or step != 0:
            return
        self.armed = False
        if self.report_dir is None:
            if hvd.rank() == self.rank:
                os.kill(os.getpid(), signal.SIGKILL)
            return
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        path = os.path.join(self.report_dir, f"rank-{hvd.rank()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"executor_pid": pid, "pid": os.getpid()}, f)
        os.replace(path + ".tmp", path)


def elastic_estimator(store_dir, backend_kwargs, callback, epochs=4):
    import torch

    from kolo.spark.common.backend import SparkBackend
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    return TorchEstimator(
        backend=SparkBackend(**backend_kwargs),
        store=Store.create(store_dir),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        loss=torch.nn.functional.mse_loss,
        feature_cols=["x"],
        label_cols=["y"],
        batch_size=8,
        epochs=epochs,
        callbacks=[callback],
        random_seed=1,
        verbose=0,
    )


def linear_rows(n=256):
    return [([i / n, 1.0 - i / n], 2.0 * i / n + 0.5) for i in range(n)]


def check_fitted(spark, fitted, epochs):
    history = fitted.getHistory()
    assert len(history["train_loss"]) == epochs, history
    assert history["train_loss"][-1] < history["train_loss"][0], history
    df = spark.createDataFrame(linear_rows(16), ["x", "y"])
    predictions = fitted.transform(df).collect()
    assert len(predictions) == 16
    column = fitted.getOutputCols()[0]
    errors = [abs(float(row[column]) - row["y"]) for row in predictions]
    assert max(errors) < 1.0, errors


def test_elastic_fit_survives_a_killed_rank(spark, tmp_path, caplog):
    """local[2]: rank 1 SIGKILLs itself at the start of epoch 2; rank 0 goes back to its
    commit (end of epoch 1), re-reads all the data as the only rank and trains the remaining
    epochs; the fitted model has the full history and transforms."""
    marker = uuid.uuid4().hex
    df = spark.createDataFrame(linear_rows(), ["x", "y"])
    est = elastic_estimator(
        str(tmp_path / "store"),
        dict(num_proc=2, min_num_proc=1, env={MARKER_VAR: marker}, stderr=io.StringIO()),
        KillRankAt(rank=1, epoch=2),
    )
    with caplog.at_level("INFO", logger="kolo.spark"):
        fitted = est.fit(df)
    messages = [record.getMessage() for record in caplog.records]
    assert any("task 1 was killed by signal 9 (SIGKILL)" in m for m in messages), messages
    assert any("round of 1 rank(s): tasks [0]" in m for m in messages), messages
    check_fitted(spark, fitted, 4)
    assert_no_orphans(marker, within=15.0)
