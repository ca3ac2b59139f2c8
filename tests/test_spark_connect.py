"""``kolo.spark.run`` from a Spark Connect client (no ``SparkContext``): a real Spark Connect
server from the pyspark package (``connect_server``, local[2] on 127.0.0.1) and its client
session (``connect_spark``), next to the classic ``spark`` session of the same process.

The functions below are pickled by value (this module is not importable in the rank
processes), so each keeps its imports inside.
"""

from __future__ import annotations

import io
import sys
import threading
import time
import uuid

import cloudpickle
import pytest
from support.rank_marker import (
    MARKER_VAR,
    assert_no_orphans,
    interrupt_main_once_running,
)

import kolo.spark
from kolo.exceptions import ConfigError, InvalidArgumentError, NotEnoughSlotsError, RankFailedError
from kolo.spark.runner import task_slots

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def collective_fn(magic):
    import os
    import sys

    import torch

    import kolo.torch as hvd

    print(f"out-line rank={os.environ['KOLO_RANK']}")
    print(f"err-line rank={os.environ['KOLO_RANK']}", file=sys.stderr)
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    names = ("KOLO_RANK", "HOROVOD_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE")
    return {
        "magic": magic,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "cross_rank": hvd.cross_rank(),
        "env": {name: os.environ.get(name) for name in names},
        "user_env": os.environ.get("KOLO_TEST_USER_VAR"),
        "sum": float(total[0]),
    }


def test_connect_results_identical_to_classic(spark, connect_spark):
    """The same function through the classic barrier RDD and through Connect's barrier
    mapInArrow stage: the same results by rank, the same prefixed output."""
    outputs = {}
    results = {}
    for name, session in (("classic", spark), ("connect", connect_spark)):
        out, err = io.StringIO(), io.StringIO()
        results[name] = kolo.spark.run(
            collective_fn,
            args=(42,),
            num_proc=2,
            env={"KOLO_TEST_USER_VAR": "seen"},
            stdout=out,
            stderr=err,
            spark=session,
        )
        outputs[name] = (out.getvalue(), err.getvalue())
    assert results["connect"] == results["classic"]
    assert [r["rank"] for r in results["connect"]] == [0, 1]
    assert [r["sum"] for r in results["connect"]] == [3.0, 3.0]
    assert results["connect"][1]["env"]["KOLO_RANK"] == "1"
    assert results["connect"][0]["user_env"] == "seen"
    out, err = outputs["connect"]
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:out-line rank={rank}\n" in out
        assert f"[{rank}]<stderr>:err-line rank={rank}\n" in err


def test_connect_default_num_proc_slots_and_probe(connect_spark):
    from kolo.spark._python_probe import _run_probe
    from kolo.spark._session import spark_target

    target = spark_target(connect_spark)
    assert target.is_connect
    assert target.default_parallelism() == 2  # the server's spark.default.parallelism
    assert task_slots(connect_spark) == 2  # local[2]
    # Without num_proc: the server's default parallelism.
    assert kolo.spark.run(lambda: 7, spark=connect_spark) == [7, 7]
    # The executors' Python check runs as a Connect job and reports this venv's Python.
    answers = _run_probe(target, 2, 60)
    assert answers is not None and len(answers) == 2
    assert all(answer[0] for answer in answers), answers
    assert {answer[1] for answer in answers} == {sys.executable}


def raising_fn(marker):
    import os
    import time

    if os.environ["KOLO_RANK"] == "1":
        raise ValueError(f"boom {marker}")
    time.sleep(120)


def test_connect_rank_raising_is_rank_failed_and_stops_everything(connect_spark):
    marker = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        kolo.spark.run(
            raising_fn,
            args=(marker,),
            num_proc=2,
            env={MARKER_VAR: marker},
            stderr=io.StringIO(),
            spark=connect_spark,
        )
    elapsed = time.monotonic() - started
    err = caught.value
    assert err.rank == 1
    assert err.task_attempt == 0
    assert f"ValueError: boom {marker}" in err.remote_traceback
    assert "rank 1" in str(err)
    assert elapsed < 30, elapsed
    assert_no_orphans(marker)
    # No operation of this session is left running on the server.
    assert connect_spark.interruptAll() == []


def test_connect_cancel_interrupts_the_running_stage(connect_spark):
    """``interruptTag`` of the launch's tag kills its tasks: the stage does not end on its own
    (its tasks sleep), yet it ends within seconds of the cancel, and the tag was set in the
    stage's thread only (Connect tags are per thread)."""
    from kolo.spark._session import spark_target

    target = spark_target(connect_spark)
    tag = f"kolo-test-{uuid.uuid4().hex[:8]}"
    outcome: dict = {}

    def sleeper(partition):
        import time

        for _ in partition:
            pass
        time.sleep(300)
        yield (0, True, "slept")

    def stage():
        try:
            outcome["rows"] = target.run_tasks(
                sleeper, 2, tag, "test", "index long, success boolean, description string", True
            )
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=stage, daemon=True)
    thread.start()
    time.sleep(3)
    assert thread.is_alive()
    assert tag not in connect_spark.getTags()
    cancelled = time.monotonic()
    target.cancel(tag)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the interrupted stage did not end"
    assert time.monotonic() - cancelled < 30
    assert "error" in outcome and "rows" not in outcome


def test_connect_bad_input_is_typed(connect_spark):
    started = time.monotonic()
    with pytest.raises(NotEnoughSlotsError) as caught:
        kolo.spark.run(collective_fn, args=(1,), num_proc=3, spark=connect_spark)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "num_proc=3" in message and "has 2" in message and "local[2]" in message
    with pytest.raises(InvalidArgumentError, match="num_proc"):
        kolo.spark.run(collective_fn, num_proc=0, spark=connect_spark)
    with pytest.raises(ConfigError, match="neither a SparkSession"):
        kolo.spark.run(collective_fn, num_proc=1, spark="sc://127.0.0.1:1")


def sleeping_fn():
    import time

    print("sleeping", flush=True)
    time.sleep(300)


def test_connect_interrupt_cancels_the_job_and_leaves_no_processes(connect_spark):
    marker = uuid.uuid4().hex
    interrupt_main_once_running(marker)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        kolo.spark.run(
            sleeping_fn,
            num_proc=2,
            env={MARKER_VAR: marker},
            stdout=io.StringIO(),
            spark=connect_spark,
        )
    assert time.monotonic() - started < 60
    assert_no_orphans(marker)
    assert connect_spark.interruptAll() == []
    assert kolo.spark.run(lambda: 7, num_proc=2, spark=connect_spark) == [7, 7]


ACTIVE_SESSION_DRIVER = r"""
import sys
from pyspark.sql import SparkSession
import kolo.spark

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print("RESULTS", kolo.spark.run(lambda: __import__("os").environ["KOLO_RANK"], num_proc=2))
spark.stop()
"""


def test_connect_active_session_is_found_without_spark_argument(connect_server):
    """A user's process with only a Spark Connect session (``SparkSession.builder.remote``):
    ``kolo.spark.run`` without ``spark=`` finds that session (on main: ConfigError "needs an
    active SparkContext")."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run(
        [sys.executable, "-c", ACTIVE_SESSION_DRIVER, connect_server],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "RESULTS ['0', '1']" in done.stdout, done.stdout[-3000:]


def elastic_fn(steps, die_rank):
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
        while state.step < steps:
            if hvd.rank() == die_rank and state.step == 2 and not resets:
                os.kill(os.getpid(), signal.SIGKILL)
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            time.sleep(0.05)
            state.sizes = [*state.sizes, int(total.item())]
            state.step += 1
            state.commit()
        return {"rank": hvd.rank(), "size": hvd.size(), "sizes": state.sizes, "resets": resets}

    return train(state)


def test_connect_run_elastic_a_rank_killed_leaves_and_the_survivor_finishes(connect_spark):
    """run_elastic through Connect's (non-barrier) mapInArrow stage: rank 1 SIGKILLs itself,
    rank 0 restores its last commit and finishes alone; nothing is left running."""
    marker = uuid.uuid4().hex
    results = kolo.spark.run_elastic(
        elastic_fn,
        kwargs={"steps": 8, "die_rank": 1},
        num_proc=2,
        min_num_proc=1,
        env={MARKER_VAR: marker},
        stdout=io.StringIO(),
        stderr=io.StringIO(),
        spark=connect_spark,
    )
    assert len(results) == 1, results
    (result,) = results
    assert result["rank"] == 0 and result["size"] == 1
    assert result["sizes"][:2] == [2, 2] and set(result["sizes"][2:]) == {1}, result
    assert result["resets"] == [1]
    assert_no_orphans(marker)
    assert connect_spark.interruptAll() == []
