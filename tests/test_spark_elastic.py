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
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest

import kolo.spark
from kolo.exceptions import ConfigError, InvalidArgumentError, RankFailedError

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]
MARKER_VAR = "KOLO_TEST_MARKER"


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``KOLO_TEST_MARKER=marker`` (the rank processes)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def assert_no_orphans(marker: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_pids(marker) == [], "rank processes survived the job"


def next_job_id(spark) -> int:
    """The id the next Spark job of this context gets (counts every job ever started)."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def kolo_segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("kolo")}


def elastic_steps(steps, step_s, report_dir=None, die_rank=None):
    """An elastic loop of ``steps`` committed steps of one allreduce each; the state keeps the
    size every step ran at. With ``report_dir``, each rank writes the pid of the executor JVM
    it runs under once it is training; with ``die_rank``, that rank of the first round
    SIGKILLs itself at step 2."""
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

    def executor_pid():
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"CoarseGrainedExecutorBackend" in f.read():
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return None

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if report_dir and state.step == 1 and not resets:
                path = os.path.join(report_dir, f"rank-{hvd.rank()}.json")
                with open(path + ".tmp", "w") as f:
                    json.dump({"executor_pid": executor_pid(), "pid": os.getpid()}, f)
                os.replace(path + ".tmp", path)
            if die_rank is not None and hvd.rank() == die_rank and state.step == 2 and not resets:
                os.kill(os.getpid(), signal.SIGKILL)
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            time.sleep(step_s)
            state.sizes = state.sizes + [int(total.item())]
            state.step += 1
            state.commit()
        return {
            "rank": hvd.rank(),
            "size": hvd.size(),
            "task": int(os.environ["KOLO_TASK_INDEX"]),
            "step": state.step,
            "sizes": state.sizes,
            "resets": resets,
        }

    return train(state)


def test_a_rank_killed_leaves_and_the_survivor_finishes(spark):
    """local[2]: rank 1 SIGKILLs itself mid-training; rank 0 restores its last commit and
    finishes alone (min_num_proc=1); no rank process or shared-memory segment is left."""
    marker = uuid.uuid4().hex
    segments = kolo_segments()
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
    assert_no_orphans(marker)
    assert kolo_segments() <= segments
    print(f"run_elastic local[2], one rank killed: {elapsed:.2f}s")


def raising_elastic_fn(marker):
    import os
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
    assert_no_orphans(marker)


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
    conf = spark.sparkContext._conf
    conf.set("spark.speculation", "true")
    try:
        with pytest.raises(ConfigError, match="spark.speculation"):
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
import json, sys, time
sys.path.insert(0, sys.argv[2])
import cloudpickle
from support.spark import local_session_builder
import kolo.spark
from kolo.spark.runner import task_slots

with open(sys.argv[3], "rb") as f:
    fn, kwargs, env = cloudpickle.load(f)
session = (local_session_builder(sys.argv[1]).config("spark.executor.memory", "512m")
           .config("spark.executor.cores", "1").config("spark.cores.max", "4")
           .config("spark.default.parallelism", "2").getOrCreate())
session.sparkContext.setLogLevel("ERROR")
deadline = time.monotonic() + 120
# The four executors (one core each): JVMs start slowly on a busy machine.
while (task_slots(session.sparkContext) or 0) < 4:
    assert time.monotonic() < deadline, "the executors did not register"
    time.sleep(0.2)
results = kolo.spark.run_elastic(fn, kwargs=kwargs, num_proc=2, min_num_proc=1, env=env)
print("RESULTS " + json.dumps(results), flush=True)
session.stop()
"""


def executor_jvm(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def run_standalone_and_kill(standalone_cluster, tmp_path, fn, kwargs, report_dir, marker):
    """Runs ``fn`` with run_elastic on the standalone cluster (one core per executor, so each
    rank has its own executor JVM); once both ranks reported their executor's pid, SIGKILLs
    rank 1's executor JVM. Returns the driver's results and how long the job took after the
    kill."""
    job = tmp_path / "job.pkl"
    job.write_bytes(cloudpickle.dumps((fn, kwargs, {MARKER_VAR: marker})))
    script = tmp_path / "driver.py"
    script.write_text(STANDALONE_DRIVER)
    env = dict(os.environ, KOLO_HEARTBEAT_TIMEOUT_SECONDS="15")
    driver = subprocess.Popen(
        [sys.executable, str(script), standalone_cluster, str(REPO / "tests"), str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        reports = [report_dir / f"rank-{rank}.json" for rank in (0, 1)]
        deadline = time.monotonic() + 180
        while not all(path.exists() for path in reports):
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "the ranks never started training"
            time.sleep(0.05)
        pids = [json.loads(path.read_text())["executor_pid"] for path in reports]
        assert pids[0] != pids[1] and all(pids), pids
        victim = pids[1]
        assert b"CoarseGrainedExecutorBackend" in executor_jvm(victim)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        out, err = driver.communicate(timeout=240)
        after_kill = time.monotonic() - killed
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    lines = [line for line in out.splitlines() if line.startswith("RESULTS ")]
    assert driver.returncode == 0 and lines, out[-3000:] + err[-6000:]
    return json.loads(lines[0][len("RESULTS ") :]), after_kill


def test_standalone_survives_a_killed_executor_jvm(standalone_cluster, tmp_path):
    """An executor JVM is SIGKILLed mid-training: its rank leaves, Spark retries its task on
    another executor (attempt 1 = task index 2), the retry joins as a new worker, the survivor
    restores its last commit, and both finish the same steps with the same state."""
    marker = uuid.uuid4().hex
    segments = kolo_segments()
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    steps = 16
    results, after_kill = run_standalone_and_kill(
        standalone_cluster,
        tmp_path,
        elastic_steps,
        {"steps": steps, "step_s": 0.25, "report_dir": str(report_dir)},
        report_dir,
        marker,
    )
    assert [r["rank"] for r in results] == [0, 1], results
    assert all(r["size"] == 2 and r["step"] == steps for r in results), results
    # The survivor (an attempt-0 task) and the retry of the killed task (attempt 1 of its
    # partition: index partition + 1 * max_num_proc).
    tasks = sorted(r["task"] for r in results)
    assert tasks[0] in (0, 1) and tasks[1] in (2, 3), tasks
    # The state is rank 0's on both (the retry synced it); every committed step ran once.
    assert results[0]["sizes"] == results[1]["sizes"] and len(results[0]["sizes"]) == steps
    assert results[0]["sizes"][0] == 2 and results[0]["sizes"][-1] == 2
    survivor = next(r for r in results if r["task"] < 2)
    assert survivor["resets"] and survivor["resets"][-1] == 2, survivor
    assert_no_orphans(marker)
    assert kolo_segments() <= segments
    print(f"run_elastic standalone: executor JVM SIGKILLed, job done {after_kill:.1f}s later")
    print(json.dumps(results))


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
    assert_no_orphans(marker)
