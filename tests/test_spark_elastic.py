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
