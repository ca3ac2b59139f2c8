"""``kolo.spark.run`` on real Spark: local[2] (the session fixture) and a standalone cluster of
two workers simulating two hosts.

The functions below are pickled by value (this module is not importable in the rank
processes), so each keeps its imports inside.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest
from support.rank_marker import (
    MARKER_VAR,
    assert_no_orphans,
    interrupt_main_once_running,
)

import kolo.spark
from kolo.exceptions import InvalidArgumentError, NotEnoughSlotsError, RankFailedError
from kolo.spark.common.backend import Backend

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[1]


class RankAtUnpickle:
    """Unpickles as the value of ``KOLO_RANK`` at that moment (in the rank process)."""

    def __reduce__(self):
        return (os.getenv, ("KOLO_RANK",))


def collective_fn(magic, rank_at_unpickle):
    import os
    import sys

    import torch

    import kolo.torch as hvd

    env_rank = int(os.environ["KOLO_RANK"])
    env = {k: os.environ[k] for k in ("HOROVOD_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK")}
    print(f"out-line rank={env_rank}")
    print(f"err-line rank={env_rank}", file=sys.stderr)
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {
        "magic": magic,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "env_rank": env_rank,
        "env": env,
        "rank_at_unpickle": rank_at_unpickle,
        "sum": float(total[0]),
    }


def test_results_by_rank_collective_env_and_output(spark):
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    results = kolo.spark.run(
        collective_fn, args=(42, RankAtUnpickle()), num_proc=2, stdout=out, stderr=err
    )
    launch_s = time.monotonic() - started
    assert [r["rank"] for r in results] == [0, 1]
    for rank, result in enumerate(results):
        assert result["magic"] == 42
        assert result["size"] == 2
        # One host: local rank = rank. The env was set before fn was unpickled, and init()
        # kept the same assignment.
        assert result["local_rank"] == rank
        assert result["env_rank"] == rank
        assert result["rank_at_unpickle"] == str(rank)
        assert result["env"] == {
            "HOROVOD_RANK": str(rank),
            "KOLO_SIZE": "2",
            "KOLO_LOCAL_RANK": str(rank),
        }
        assert result["sum"] == 3.0
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:out-line rank={rank}\n" in out.getvalue()
        assert f"[{rank}]<stderr>:err-line rank={rank}\n" in err.getvalue()
    assert "<stderr>" not in out.getvalue()
    print(f"kolo.spark.run local[2] with init+allreduce: {launch_s:.2f}s")


def messages_fn(size_mb):
    import os

    from kolo.spark.task import get_available_devices, send_to_driver

    rank = int(os.environ["KOLO_RANK"])
    for step in range(3):
        send_to_driver({"rank": rank, "step": step})
    print("no init here")
    return {
        "rank": rank,
        "devices": get_available_devices(),
        "blob": bytes([rank]) * (size_mb << 20),
    }


def test_messages_big_result_timestamps_without_init(spark):
    received = []
    out = io.StringIO()
    results = kolo.spark.run(
        messages_fn,
        kwargs={"size_mb": 24},
        num_proc=2,
        stdout=out,
        stderr=io.StringIO(),
        prefix_output_with_timestamp=True,
        _on_message=lambda rank, obj: received.append((rank, obj)),
    )
    for rank, result in enumerate(results):
        assert result["rank"] == rank
        assert result["devices"] == []
        assert len(result["blob"]) == 24 << 20 and result["blob"][-1] == rank
    for rank in (0, 1):
        steps = [obj["step"] for r, obj in received if r == rank]
        assert steps == [0, 1, 2]
        assert all(obj["rank"] == rank for r, obj in received if r == rank)
    lines = [line for line in out.getvalue().splitlines() if "no init here" in line]
    assert len(lines) == 2
    year = time.strftime("%Y")
    for line in lines:
        # "Mon Jan 01 00:00:00 2024[0]<stdout>:no init here"
        assert line.split("[")[0].endswith(year), line
        assert "]<stdout>:no init here" in line


def raising_fn(marker):
    import os
    import time

    if os.environ["KOLO_RANK"] == "1":
        time.sleep(0.5)
        raise ValueError(f"boom {marker}")
    time.sleep(120)


def test_rank_raising_fails_fast_with_traceback_and_stops_others(spark):
    marker = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        kolo.spark.run(
            raising_fn, args=(marker,), num_proc=2, env={MARKER_VAR: marker}, stderr=io.StringIO()
        )
    elapsed = time.monotonic() - started
    err = caught.value
    assert err.rank == 1
    assert err.host
    assert err.task_attempt == 0
    assert err.task_index in (0, 1)
    assert f"ValueError: boom {marker}" in err.remote_traceback
    assert "raising_fn" in err.remote_traceback
    assert "rank 1" in str(err) and "attempt 0" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is RankFailedError
    assert (again.rank, again.host, again.remote_traceback) == (1, err.host, err.remote_traceback)
    assert elapsed < 30, elapsed
    assert_no_orphans(marker)
    print(f"rank raising -> RankFailedError in {elapsed:.2f}s")


def sigkill_fn():
    import os
    import signal
    import time

    if os.environ["KOLO_RANK"] == "1":
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def test_rank_killed_fails_fast(spark):
    marker = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        kolo.spark.run(sigkill_fn, num_proc=2, env={MARKER_VAR: marker})
    elapsed = time.monotonic() - started
    assert caught.value.rank == 1
    assert "SIGKILL" in str(caught.value)
    assert elapsed < 30, elapsed
    assert_no_orphans(marker)
    print(f"rank SIGKILLed -> RankFailedError in {elapsed:.2f}s")


def test_more_ranks_than_slots_fails_fast(spark):
    started = time.monotonic()
    with pytest.raises(NotEnoughSlotsError) as caught:
        kolo.spark.run(collective_fn, args=(1, None), num_proc=3)
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert "num_proc=3" in message and "has 2" in message and "num_proc<=2" in message


def test_bad_input_is_typed(spark):
    for bad in (0, -1, "2", 1.5, True):
        with pytest.raises(InvalidArgumentError, match="num_proc"):
            kolo.spark.run(collective_fn, num_proc=bad)
    lock = threading.Lock()
    with pytest.raises(InvalidArgumentError, match="cannot pickle"):
        kolo.spark.run(lambda: lock.locked(), num_proc=1)
    with pytest.raises(InvalidArgumentError, match="start_timeout"):
        kolo.spark.run(collective_fn, num_proc=1, start_timeout=-5)
    with pytest.raises(InvalidArgumentError, match="callable"):
        kolo.spark.run("not a function", num_proc=1)


def sleeping_fn():
    import time

    print("sleeping", flush=True)
    time.sleep(300)


def test_interrupt_cancels_the_job_and_leaves_no_processes(spark):
    marker = uuid.uuid4().hex
    interrupt_main_once_running(marker)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        kolo.spark.run(sleeping_fn, num_proc=2, env={MARKER_VAR: marker}, stdout=io.StringIO())
    assert time.monotonic() - started < 60
    assert_no_orphans(marker)
    # The session is still usable afterwards.
    assert kolo.spark.run(lambda: 7, num_proc=2) == [7, 7]


STANDALONE_DRIVER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from support.spark import local_session_builder
import kolo.spark

def fn():
    import os
    import torch
    import kolo.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    return dict(rank=hvd.rank(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(),
                env_rank=int(os.environ["KOLO_RANK"]), host=os.environ.get("KOLO_HOSTNAME"),
                sum=float(total[0]))

session = (local_session_builder(sys.argv[1]).config("spark.executor.memory", "512m")
           .config("spark.cores.max", "4").config("spark.default.parallelism", "4").getOrCreate())
session.sparkContext.setLogLevel("ERROR")
results = kolo.spark.run(fn, num_proc=4)
print("RESULTS " + json.dumps(results))
session.stop()
"""


def test_standalone_cluster_two_hosts(standalone_cluster, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(STANDALONE_DRIVER)
    done = subprocess.run(
        [sys.executable, str(script), standalone_cluster, str(REPO / "tests")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    results = json.loads(lines[0][len("RESULTS ") :])
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["sum"] == 4.0 and r["env_rank"] == r["rank"] for r in results)
    hosts = [r["host"] for r in results]
    assert sorted(hosts) == ["kolo-host-a", "kolo-host-a", "kolo-host-b", "kolo-host-b"], hosts
    # Each host's ranks are consecutive, local ranks count within the host.
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2]
    assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
    assert all(r["local_size"] == 2 and r["cross_size"] == 2 for r in results)
    assert [r["cross_rank"] for r in results] == [0, 0, 1, 1]


#: ``horovod.spark.run``'s parameters in Horovod 0.28.1's order (horovod/spark/runner.py).
HOROVOD_RUN_PARAMS = [
    "fn",
    "args",
    "kwargs",
    "num_proc",
    "start_timeout",
    "use_mpi",
    "use_gloo",
    "extra_mpi_args",
    "env",
    "stdout",
    "stderr",
    "verbose",
    "nics",
    "prefix_output_with_timestamp",
    "executable",
]


def test_signature_is_horovods_in_order():
    import inspect

    params = inspect.signature(kolo.spark.run).parameters
    positional = [
        name for name, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    assert positional == HOROVOD_RUN_PARAMS


def env_fn(scale):
    import os

    print("env_fn ran")
    return scale * int(os.environ["KOLO_RANK"]), os.environ.get(MARKER_VAR)


def test_positional_call_in_horovods_order(spark):
    """Every argument given by position, as a script written against horovod.spark.run
    passes them: each lands on its parameter (env, stdout, timestamps, ...)."""
    out, err = io.StringIO(), io.StringIO()
    marker = uuid.uuid4().hex
    with pytest.warns(UserWarning) as warned:
        results = kolo.spark.run(
            env_fn,  # fn
            (10,),  # args
            {},  # kwargs
            2,  # num_proc
            60,  # start_timeout
            True,  # use_mpi
            None,  # use_gloo
            "-x NCCL_DEBUG",  # extra_mpi_args
            {MARKER_VAR: marker},  # env
            out,  # stdout
            err,  # stderr
            1,  # verbose
            None,  # nics
            True,  # prefix_output_with_timestamp
            None,  # executable
        )
    assert results == [(0, marker), (10, marker)]
    messages = " ".join(str(w.message) for w in warned)
    assert "no MPI controller on Spark" in messages and "extra_mpi_args" in messages
    stamp = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    assert re.search(stamp + r"\[1\]<stdout>:env_fn ran", out.getvalue()), out.getvalue()
    # use_gloo=True: kolo's own transport is the Gloo path, nothing to say.
    assert kolo.spark.run(env_fn, (1,), num_proc=2, use_gloo=True)[1][0] == 1
    with pytest.raises(InvalidArgumentError, match="use_mpi"):
        kolo.spark.run(env_fn, (1,), num_proc=2, use_mpi="yes")


def system_python_without_kolo() -> str:
    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip("no /usr/bin/python3 on this machine")
    probe = subprocess.run(
        [python, "-c", "import cloudpickle, kolo._native"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
    )
    if probe.returncode == 0:
        pytest.skip(f"{python} can import kolo: it cannot play the executor without kolo")
    return python


def test_executors_python_without_kolo_fails_at_once_at_the_driver(spark, tmp_path):
    """A session whose executors run a Python without kolo (what spark.pyspark.python /
    PYSPARK_PYTHON set: the context's ``pythonExec``) fails in ``run`` at once, with a
    ConfigError naming that Python as the executors report it and the fix."""
    import torch

    from kolo.exceptions import ConfigError
    from kolo.spark.common.backend import SparkBackend
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    python = system_python_without_kolo()
    version = subprocess.run(
        [python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    sc = spark.sparkContext
    driver_python = sc.pythonExec
    sc.pythonExec = python
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError) as raised:
            kolo.spark.run(env_fn, (1,), num_proc=2)
        assert time.monotonic() - started < 30
        with pytest.raises(ConfigError):
            SparkBackend(num_proc=2).run(env_fn, args=(1,))
        # Estimator fit: before any data is written to the store.
        store = Store.create(str(tmp_path / "store"))
        with pytest.raises(ConfigError, match="cannot import kolo"):
            TorchEstimator(
                num_proc=2,
                store=store,
                model=torch.nn.Linear(2, 1),
                loss=torch.nn.functional.mse_loss,
                optimizer=torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1),
                feature_cols=["x"],
                label_cols=["y"],
            ).fit(spark.createDataFrame([([1.0, 2.0], 0.0)], ["x", "y"]))
        assert not os.path.exists(store.get_train_data_path(0))
    finally:
        sc.pythonExec = driver_python
    text = str(raised.value)
    assert f"executors run {python} (Python {version})" in text
    assert "No module named" in text
    for fix in ("PYSPARK_PYTHON", "spark.pyspark.python", "spark.executorEnv.PYTHONPATH"):
        assert fix in text
    # The session's own Python works again (the failure was not remembered as a success).
    assert kolo.spark.run(env_fn, (1,), num_proc=2)[1][0] == 1


def test_executors_python_missing_is_a_config_error(spark):
    from kolo.exceptions import ConfigError

    sc = spark.sparkContext
    driver_python = sc.pythonExec
    sc.pythonExec = "/nonexistent/bin/python3"
    try:
        with pytest.raises(ConfigError, match=r"Cannot run program \"/nonexistent/bin/python3\""):
            kolo.spark.run(env_fn, (1,), num_proc=1)
    finally:
        sc.pythonExec = driver_python


class RecordingBackend(Backend):
    """A user's Backend (Horovod's interface): runs through kolo.spark.run on 2 ranks and
    records the calls the estimator makes."""

    def __init__(self):
        self.calls = []

    def run(self, fn, args=(), kwargs={}, env=None):  # noqa: B006 - Horovod's signature
        self.calls.append((args, kwargs, env))
        return kolo.spark.run(fn, args=args, kwargs=kwargs, num_proc=2, env=env)

    def num_processes(self):
        return 2


def test_estimator_trains_through_a_user_backend(spark, tmp_path):
    import torch

    from kolo.exceptions import InvalidArgumentError
    from kolo.spark.common.backend import SparkBackend
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    backend = RecordingBackend()
    model = torch.nn.Linear(2, 1)
    params = dict(
        store=Store.create(str(tmp_path)),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss=torch.nn.functional.mse_loss,
        feature_cols=["x"],
        label_cols=["y"],
        batch_size=4,
        verbose=0,
    )
    df = spark.createDataFrame([([float(i), 1.0], float(i % 2)) for i in range(32)], ["x", "y"])
    trained = TorchEstimator(backend=backend, **params).fit(df)
    assert backend.calls == [((), {}, {})]  # Horovod's call: backend.run(trainer, env={})
    assert trained.getHistory()["train_loss"]
    # Horovod: 'At most one of parameters "backend" and "num_proc" may be specified'.
    with pytest.raises(ValueError, match='"backend" and "num_proc"'):
        TorchEstimator(backend=backend, num_proc=2, **params).fit(df)
    with pytest.raises(InvalidArgumentError, match=r"'stdot'.*stdout"):
        SparkBackend(num_proc=2, stdot=None)
    assert SparkBackend().num_processes() == spark.sparkContext.defaultParallelism
