"""The task side of :func:`kolo.spark.run`, and helpers for the function it runs.

Inside the function ``kolo.spark.run`` executes:

- :func:`get_available_devices` gives the Spark GPU addresses of the task behind this rank;
- :func:`send_to_driver` sends a small picklable object to the driver (``run(...,
  _on_message=callback)`` receives it), in order.

Example::

    import kolo.spark
    from kolo.spark.task import get_available_devices, send_to_driver

    def fn():
        send_to_driver({"step": 1})
        return get_available_devices()

    kolo.spark.run(fn, num_proc=2, _on_message=lambda rank, msg: print(rank, msg))

The rest of the module is internal: ``_run_barrier_task`` is what each barrier task runs (it
starts the rank process and waits for it); the rank process is
:func:`kolo._rank_process.rank_main`, shared with ``kolo.run``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Iterable, Iterator, Optional

from kolo._env import ELASTIC_JOINING_ENV
from kolo._rank_gpu import GPU_ADDRESSES_VAR, assigned_gpus
from kolo._rank_process import rank_code
from kolo.spark._warm_start import WarmStart, rank_args, start_server

__all__ = ["get_available_devices", "send_to_driver"]

#: How the task runner starts a fresh rank process (``executable -c CHILD_CODE [MODULES]``).
CHILD_CODE = rank_code("kolo.spark.run", report_times=True, record_modules=True)


def get_available_devices() -> list[str]:
    """The Spark GPU addresses (``TaskContext.resources()['gpu'].addresses``) of the task that
    runs this rank; empty when the task has no GPUs.

    Example::

        def fn():
            import torch
            devices = kolo.spark.task.get_available_devices()
            if devices:
                torch.cuda.set_device(int(devices[0]))
    """
    addresses = assigned_gpus()
    if addresses is not None:
        return addresses
    try:
        from pyspark import TaskContext
    except ImportError:
        return []
    context = TaskContext.get()
    if context is None:
        return []
    gpu = context.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None else []


def send_to_driver(obj: Any) -> None:
    """Sends a small picklable object to the driver of ``kolo.spark.run``, which calls its
    ``_on_message(rank, obj)`` callback with it; messages of one rank arrive in order.

    Example::

        def fn():
            for epoch in range(3):
                send_to_driver({"epoch": epoch, "loss": 0.1})
    """
    import cloudpickle

    from kolo import _native

    _native.session_send(cloudpickle.dumps(obj))


def _task_gpu_addresses(context: Any) -> list[str]:
    try:
        gpu = context.resources().get("gpu")
    except Exception:
        return []
    return list(gpu.addresses) if gpu is not None else []


def _task_hostname(user_env: dict[str, str]) -> str:
    """The host name a task's rank registers from: ``KOLO_HOSTNAME`` of the job's ``env``, else
    of the executor, else the system host name."""
    return user_env.get("KOLO_HOSTNAME") or os.environ.get("KOLO_HOSTNAME") or socket.gethostname()


def _run_barrier_task(
    job_env: dict[str, str],
    user_env: dict[str, str],
    executable: Optional[str],
    term_grace: float,
    warm: Optional[WarmStart],
    partition: Iterable[Any],
) -> Iterator[tuple[int, bool, str, float]]:
    """One barrier task: start the rank process for this partition and wait for it. Its row
    ends with when it started (unix seconds; the launch report's end of Spark's scheduling).
    With ``warm`` on, this executor's warm rank server forks the rank process when it runs
    (:mod:`kolo.spark._warm_start`), and a task whose rank succeeded starts one."""
    started = time.time()
    from pyspark import BarrierTaskContext

    from kolo import _native

    for _ in partition:
        pass
    context = BarrierTaskContext.get()
    index = context.partitionId()
    attempt = context.attemptNumber()
    envs = list(user_env.items())
    envs += list(job_env.items())
    envs += [
        ("KOLO_TASK_INDEX", str(index)),
        (GPU_ADDRESSES_VAR, ",".join(_task_gpu_addresses(context))),
        ("PYTHONUNBUFFERED", "1"),
    ]
    hostname = _task_hostname(user_env)
    program = executable or sys.executable
    launch_names = sorted({*job_env, "KOLO_TASK_INDEX", GPU_ADDRESSES_VAR})
    args, slot = rank_args(warm, program, CHILD_CODE, launch_names)
    success, description = _native.spark_run_task(
        envs, program, args, attempt, hostname, term_grace
    )
    if success and slot is not None and warm is not None:
        start_server(slot, warm, program, {**os.environ, **dict(envs)}, launch_names)
    yield (index, bool(success), str(description), started)


#: How a ``kolo.spark.run_elastic`` task starts its rank process (``executable -c ...``).
ELASTIC_CHILD_CODE = "from kolo.spark._elastic_rank import main; main()"
#: The job driver's bound on task indices (``MAX_TASKS`` in collective/src/control/service.rs).
_MAX_TASK_INDICES = 1 << 20


def _run_elastic_task(
    job_env: dict[str, str],
    user_env: dict[str, str],
    executable: Optional[str],
    term_grace: float,
    max_num_proc: int,
    partition: Iterable[Any],
) -> Iterator[tuple[int, bool, str]]:
    """One task of ``kolo.spark.run_elastic`` (not a barrier task): attempt ``a`` of partition
    ``p`` is task ``p + a * max_num_proc``; start its rank process and wait for it."""
    from pyspark import TaskContext

    from kolo import _native

    for _ in partition:
        pass
    context = TaskContext.get()
    attempt = context.attemptNumber()
    index = context.partitionId() + attempt * max_num_proc
    if index >= _MAX_TASK_INDICES:
        yield (index, False, f"attempt {attempt} is past the task indices kolo supports")
        return
    first_round = int(job_env.get("KOLO_NUM_TASKS", "1"))
    num_tasks = max(first_round, index + 1)
    hostname = _task_hostname(user_env)
    envs = list(user_env.items())
    envs += list(job_env.items())
    envs += [
        ("KOLO_TASK_INDEX", str(index)),
        ("KOLO_NUM_TASKS", str(num_tasks)),
        # A task past the first round joins a running job: it warms its framework up before
        # registering, as kolorun's added ranks do (the running ranks wait for it from then).
        *([(ELASTIC_JOINING_ENV, "1")] if index >= first_round else []),
        # The host the rank registers from, fixed before it joins: `hvd.init()` then finds the
        # same job environment as the rank process's early registration and adopts it (after
        # the join the rank variables include HOROVOD_HOSTNAME, which would otherwise differ
        # from the unset name the early registration saw, and init() would register again).
        ("KOLO_HOSTNAME", hostname),
        (GPU_ADDRESSES_VAR, ",".join(_task_gpu_addresses(context))),
        ("PYTHONUNBUFFERED", "1"),
    ]
    program = executable or sys.executable
    success, description = _native.spark_run_task(
        envs, program, ["-c", ELASTIC_CHILD_CODE], attempt, hostname, term_grace
    )
    yield (index, bool(success), str(description))
