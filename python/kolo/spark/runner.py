"""The driver side of :func:`kolo.spark.run` (Horovod's ``horovod.spark.run``)."""

from __future__ import annotations

import functools
import sys
import time
import warnings
from typing import Any, Callable, Optional, TextIO

from kolo.exceptions import (
    InvalidArgumentError,
)
from kolo.spark._driver_job import (
    RUN_TASK_ROW_SCHEMA,
    TERM_GRACE_S,
    _bind_ip,
    _check_num_proc,
    _check_slots,
    _Job,
    _pickle_payload,
    _start_timeout,
    log,
    task_slots,
)
from kolo.spark._elastic import run_elastic  # Horovod's path: horovod.spark.runner.run_elastic
from kolo.spark._launch_report import LaunchReport
from kolo.spark._python_probe import (
    PROBE_TIMEOUT_S,
    diagnose_executor_python,
    executor_python_checked,
    remember_executor_python,
)
from kolo.spark._session import spark_target
from kolo.spark._warm_start import WarmStart, mentions_fork_unsafe, warm_start_options

__all__ = ["run", "run_elastic", "task_slots"]


def run(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Optional[dict] = None,
    num_proc: Optional[int] = None,
    start_timeout: Optional[float] = None,
    use_mpi: Optional[bool] = None,
    use_gloo: Optional[bool] = None,
    extra_mpi_args: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
    stdout: Optional[TextIO] = None,
    stderr: Optional[TextIO] = None,
    verbose: int = 1,
    nics: Optional[Any] = None,
    prefix_output_with_timestamp: bool = False,
    executable: Optional[str] = None,
    *,
    spark: Any = None,
    _on_message: Optional[Callable[[int, Any], None]] = None,
    _on_launch_report: Optional[Callable[[LaunchReport], None]] = None,
) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` ranks of a Spark barrier stage and returns
    the results ordered by rank (Horovod's ``horovod.spark.run``).

    Each barrier task starts a rank process (``executable``, default this Python) that
    registers with a job driver service running here, gets its rank (a host's ranks are
    consecutive), sets ``KOLO_RANK``/``HOROVOD_RANK`` and the other rank variables, then
    unpickles and runs ``fn``; ``hvd.init()`` inside ``fn`` uses that same rank. The rank's
    stdout/stderr are written to ``stdout``/``stderr`` (default: this process's
    ``sys.stdout``/``sys.stderr``) prefixed ``[rank]<stdout>:``; results come back through the
    driver service, not Spark's ``collect`` (no ``spark.driver.maxResultSize`` limit).

    When the executors' Python cannot import kolo (or cannot run), ``run`` raises
    :class:`~kolo.exceptions.ConfigError` naming that Python (path and version) and how to
    point the executors at one with kolo. The first launch of an application finds out after
    the fact: it starts the stage at once, and only when the launch fails runs one tiny job
    that asks the executors' Python (no extra Spark job on the way to a working launch); a
    launch that ran is remembered, so later failures are not diagnosed again.

    A rank that raises or dies stops every other rank, and ``run`` raises
    :class:`~kolo.exceptions.RankFailedError` with its rank, host, task attempt and traceback.
    Ctrl-C cancels the stage and stops every rank process.

    It runs on a classic Spark application and on a Spark Connect client
    (``SparkSession.builder.remote("sc://...")``, no ``SparkContext``): there the barrier
    stage is a ``mapInArrow(..., barrier=True)`` on ``spark.range(num_proc)``, cancelled
    through an operation tag, and the job driver service listens on this client's address
    on the route to the Connect server, which the executors must be able to reach.

    Args:
        fn: the function every rank runs (picklable with cloudpickle).
        args: its positional arguments.
        kwargs: its keyword arguments.
        num_proc: the number of ranks; default ``spark.sparkContext.defaultParallelism``
            (Spark Connect: the server's ``spark.default.parallelism``, else its ``local[N]``
            or executors x cores). The cluster must have that many task slots.
        start_timeout: seconds for every task to start and register; default 600
            (``KOLO_SPARK_START_TIMEOUT`` / ``HOROVOD_SPARK_START_TIMEOUT``).
        use_mpi: Horovod's choice of its MPI controller. kolo has none on Spark: with
            ``use_mpi=True`` (or ``extra_mpi_args``) the ranks start from the barrier tasks
            and talk over kolo's own transport, and a warning says so once.
        use_gloo: Horovod's choice of its Gloo controller; accepted (kolo's transport is
            what Gloo is in Horovod: the ranks' own TCP/shared-memory links).
        extra_mpi_args: extra ``mpirun`` arguments in Horovod; no ``mpirun`` runs here, so
            they are ignored with a warning.
        env: variables added to every rank process's environment.
        stdout: where the ranks' standard output goes.
        stderr: where the ranks' standard error goes.
        verbose: 0 quiet, 1 launch summary in the log, 2 progress of the launch on stderr.
        nics: network interface name(s) the driver service listens on (default: the address
            Spark's driver uses, ``spark.driver.host``).
        prefix_output_with_timestamp: put the time each line was read before its prefix.
        executable: the Python the rank processes run; default ``sys.executable``.
        spark: the session to run on (classic or Spark Connect ``SparkSession``, or a
            ``SparkContext``); default the active ``SparkContext``, else the active Spark
            Connect session.
        _on_message: called on the driver with ``(rank, obj)`` for each
            :func:`kolo.spark.task.send_to_driver` of a rank.
        _on_launch_report: called on the driver, after a successful run, with the launch's
            :class:`~kolo.spark._launch_report.LaunchReport`: where the time from the call to
            every rank's function starting went (also logged at INFO, and printed on
            ``stderr`` with ``verbose=2``).

    Example::

        import kolo.spark

        def fn(magic_number):
            import kolo.torch as hvd
            hvd.init()
            return magic_number, hvd.rank(), hvd.size()

        print(kolo.spark.run(fn, args=(42,), num_proc=2))
        # [(42, 0, 2), (42, 1, 2)]
    """
    report = LaunchReport(num_proc=0)
    report.mark("called")
    kwargs = {} if kwargs is None else kwargs
    _notice_mpi(use_mpi, use_gloo, extra_mpi_args)
    target = spark_target(spark)
    num_proc = _check_num_proc(target.default_parallelism() if num_proc is None else num_proc)
    start_timeout_s = _start_timeout(start_timeout)
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
        raise InvalidArgumentError(
            f"args must be a tuple and kwargs a dict (got {type(args).__name__} and "
            f"{type(kwargs).__name__})"
        )
    if env is not None and not (
        isinstance(env, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise InvalidArgumentError("env must be a dict of str to str (environment variables)")
    if executable is not None and not isinstance(executable, str):
        raise InvalidArgumentError("executable must be the path of a Python interpreter (a str)")
    warm = warm_start_options()
    payload = _pickle_payload(fn, tuple(args), kwargs)
    unsafe = mentions_fork_unsafe(payload) if warm.enabled else None
    if unsafe is not None:
        log.debug("kolo.spark.run: fresh rank processes (the function uses %s)", unsafe)
        warm = WarmStart(enabled=False, idle_s=warm.idle_s)
    _check_slots(target, num_proc)
    report.num_proc = num_proc
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    bind_ip = _bind_ip(target, nics)
    checked = executor_python_checked(target)
    try:
        results = _launch(
            target,
            num_proc,
            start_timeout_s,
            payload,
            bind_ip,
            (out, err),
            dict(env or {}),
            executable,
            verbose,
            prefix_output_with_timestamp,
            _on_message,
            report,
            warm,
        )
    except Exception as error:
        if not checked:
            # Was it the executors' Python? Asked only now, so a working launch skips the job.
            timeout = min(start_timeout_s, PROBE_TIMEOUT_S)
            diagnosis = diagnose_executor_python(target, num_proc, timeout)
            if diagnosis is not None:
                raise diagnosis from error
        raise
    remember_executor_python(target)
    if _on_launch_report is not None:
        _on_launch_report(report)
    return results


def _launch(
    target: Any,
    num_proc: int,
    start_timeout_s: float,
    payload: bytes,
    bind_ip: str,
    streams: tuple[TextIO, TextIO],
    user_env: dict[str, str],
    executable: Optional[str],
    verbose: int,
    timestamps: bool,
    on_message: Optional[Callable[[int, Any], None]],
    report: LaunchReport,
    warm: WarmStart,
) -> list[Any]:
    """The launch proper: the job driver service, the barrier stage, the driver loop; fills
    in ``report`` and returns the results by rank."""
    from kolo import _native

    out, err = streams
    report.mark("service_starting")
    launched = time.monotonic()
    driver = _native.LaunchDriver(num_proc, f"{bind_ip}:0", start_timeout_s)
    job = _Job(target, driver, num_proc, out, err, timestamps, on_message)
    job.report = report
    try:
        driver.put_payload(payload)
        job_env = dict(driver.worker_env(0))
        job_env.pop("KOLO_TASK_INDEX", None)
        task_fn = functools.partial(
            _task_entry(), job_env, user_env, executable, TERM_GRACE_S, warm
        )
        if verbose >= 2:
            print(
                f"kolo.spark.run: starting {num_proc} rank(s); job driver at {driver.addr}",
                file=err,
            )
        report.mark("submitted")
        job.start_stage(task_fn, RUN_TASK_ROW_SCHEMA)
        job.wait()
        results = job.results()
    except KeyboardInterrupt:
        job.stop("kolo.spark.run was interrupted on the driver (Ctrl-C)")
        raise
    except BaseException:
        job.stop("kolo.spark.run failed on the driver")
        raise
    finally:
        job.close()
    # The stage's rows are in once close() saw it end (they carry when each task started).
    report.tasks.update({int(row[0]): float(row[3]) for row in job.stage_rows if len(row) > 3})
    log.info(
        "kolo.spark.run: %d rank(s) finished in %.1fs; %s",
        num_proc,
        time.monotonic() - launched,
        report.describe(),
    )
    if verbose >= 2:
        print(f"kolo.spark.run: {report.describe()}", file=err)
    return results


def _notice_mpi(use_mpi: Any, use_gloo: Any, extra_mpi_args: Any) -> None:
    """Says (once per call site) what kolo does instead of Horovod's MPI controller."""
    for name, value in (("use_mpi", use_mpi), ("use_gloo", use_gloo)):
        if value is not None and not isinstance(value, bool):
            raise InvalidArgumentError(f"{name}={value!r} must be True, False or None")
    if extra_mpi_args is not None and not isinstance(extra_mpi_args, str):
        raise InvalidArgumentError(
            f"extra_mpi_args={extra_mpi_args!r} must be a string of mpirun arguments or None"
        )
    if use_mpi and not use_gloo:
        warnings.warn(
            "kolo.spark.run(use_mpi=True): kolo has no MPI controller on Spark; the ranks start "
            "from Spark's barrier tasks and use kolo's own transport (Horovod's Gloo path)",
            UserWarning,
            stacklevel=3,
        )
    if extra_mpi_args:
        warnings.warn(
            f"kolo.spark.run(extra_mpi_args={extra_mpi_args!r}) is ignored: no mpirun runs on "
            "Spark under kolo; set the ranks' environment with env= instead",
            UserWarning,
            stacklevel=3,
        )


def _task_entry() -> Callable[..., Any]:
    from kolo.spark.task import _run_barrier_task

    return _run_barrier_task
