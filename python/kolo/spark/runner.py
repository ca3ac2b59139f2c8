"""The driver side of :func:`kolo.spark.run` (Horovod's ``horovod.spark.run``)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
import time
import uuid
import warnings
from datetime import datetime
from typing import Any, Callable, Optional, TextIO

from kolo._nics import nics_ip
from kolo.exceptions import (
    ConfigError,
    InvalidArgumentError,
    LaunchError,
    NotEnoughSlotsError,
    RankFailedError,
)
from kolo.spark._python_probe import PROBE_TIMEOUT_S, check_executor_python

__all__ = ["run", "run_elastic", "task_slots"]

log = logging.getLogger("kolo.spark")

#: Horovod's default start timeout (seconds) and the variables that override it.
DEFAULT_START_TIMEOUT_S = 600.0
START_TIMEOUT_VARS = ("KOLO_SPARK_START_TIMEOUT", "HOROVOD_SPARK_START_TIMEOUT")
#: How long ``run`` waits for executors to register before judging the cluster's slots.
SLOTS_WAIT_VAR = "KOLO_SPARK_SLOTS_WAIT_SECONDS"
DEFAULT_SLOTS_WAIT_S = 10.0
#: After SIGTERM, how long a rank process gets before SIGKILL.
TERM_GRACE_S = 3.0
#: After a failure or Ctrl-C, how long ``run`` waits for every task to stop its process.
STOP_WAIT_S = 15.0
#: How often the driver loop polls.
POLL_S = 0.1


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
    _on_message: Optional[Callable[[int, Any], None]] = None,
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

    Before the stage starts, one tiny job checks that the executors' Python imports kolo;
    when it does not, ``run`` raises :class:`~kolo.exceptions.ConfigError` naming that Python
    (path and version) and how to point the executors at one with kolo.

    A rank that raises or dies stops every other rank, and ``run`` raises
    :class:`~kolo.exceptions.RankFailedError` with its rank, host, task attempt and traceback.
    Ctrl-C cancels the stage and stops every rank process.

    Args:
        fn: the function every rank runs (picklable with cloudpickle).
        args: its positional arguments.
        kwargs: its keyword arguments.
        num_proc: the number of ranks; default ``spark.sparkContext.defaultParallelism``. The
            cluster must have that many task slots.
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
        _on_message: called on the driver with ``(rank, obj)`` for each
            :func:`kolo.spark.task.send_to_driver` of a rank.

    Example::

        import kolo.spark

        def fn(magic_number):
            import kolo.torch as hvd
            hvd.init()
            return magic_number, hvd.rank(), hvd.size()

        print(kolo.spark.run(fn, args=(42,), num_proc=2))
        # [(42, 0, 2), (42, 1, 2)]
    """
    kwargs = {} if kwargs is None else kwargs
    _notice_mpi(use_mpi, use_gloo, extra_mpi_args)
    sc = _active_spark_context()
    num_proc = _check_num_proc(sc.defaultParallelism if num_proc is None else num_proc)
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
    payload = _pickle_payload(fn, tuple(args), kwargs)
    _check_slots(sc, num_proc)
    check_executor_python(sc, num_proc, min(start_timeout_s, PROBE_TIMEOUT_S))
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    bind_ip = _bind_ip(sc, nics)

    from kolo import _native

    launched = time.monotonic()
    driver = _native.LaunchDriver(num_proc, f"{bind_ip}:0", start_timeout_s)
    job = _Job(sc, driver, num_proc, out, err, prefix_output_with_timestamp, _on_message)
    try:
        driver.put_payload(payload)
        job_env = dict(driver.worker_env(0))
        job_env.pop("KOLO_TASK_INDEX", None)
        task_fn = functools.partial(
            _task_entry(), job_env, dict(env or {}), executable, TERM_GRACE_S
        )
        if verbose >= 2:
            print(
                f"kolo.spark.run: starting {num_proc} rank(s); job driver at {driver.addr}",
                file=err,
            )
        job.start_stage(task_fn)
        job.wait()
        results = job.results()
        log.info(
            "kolo.spark.run: %d rank(s) finished in %.1fs", num_proc, time.monotonic() - launched
        )
        return results
    except KeyboardInterrupt:
        job.stop("kolo.spark.run was interrupted on the driver (Ctrl-C)")
        raise
    except BaseException:
        job.stop("kolo.spark.run failed on the driver")
        raise
    finally:
        job.close()


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


class _Job:
    """One launch: the Spark stage in a background thread and the driver loop."""

    def __init__(
        self,
        sc: Any,
        driver: Any,
        num_proc: int,
        out: TextIO,
        err: TextIO,
        timestamps: bool,
        on_message: Optional[Callable[[int, Any], None]],
    ) -> None:
        self.sc = sc
        self.driver = driver
        self.num_proc = num_proc
        self.out = out
        self.err = err
        self.timestamps = timestamps
        self.on_message = on_message
        self.group = f"kolo.spark.run-{uuid.uuid4().hex[:12]}"
        self.thread: Optional[threading.Thread] = None
        self.stage_error: Optional[BaseException] = None
        self.stage_done = threading.Event()

    def start_stage(self, task_fn: Callable[..., Any]) -> None:
        def stage() -> None:
            try:
                self.sc.setJobGroup(self.group, "kolo.spark.run", interruptOnCancel=True)
                rdd = self.sc.parallelize(range(self.num_proc), self.num_proc)
                rdd.barrier().mapPartitions(task_fn).collect()
            except BaseException as error:
                self.stage_error = error
            finally:
                self.stage_done.set()

        self.thread = threading.Thread(target=stage, name="kolo-spark-stage", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        """Runs the driver loop until every rank process ended; raises on the first failure."""
        while True:
            self.pump(POLL_S)
            failure = self.driver.failure()
            if failure is not None:
                self.stop(None)
                raise self.rank_failed(failure)
            if self.driver.all_exited():
                return
            if self.stage_done.is_set():
                # The tasks post their exits before they return: drain what is in flight.
                self.pump(0.5)
                if self.driver.all_exited() or self.driver.failure() is not None:
                    continue
                raise LaunchError(
                    "the Spark stage of kolo.spark.run ended before every rank finished: "
                    f"{_spark_message(self.stage_error) if self.stage_error else 'no error'}"
                ) from self.stage_error

    def pump(self, timeout: float) -> None:
        import cloudpickle

        for event in self.driver.poll(timeout):
            kind = event[0]
            if kind == "output":
                _, task, rank, is_stderr, text, micros = event
                self.write(self.err if is_stderr else self.out, task, rank, is_stderr, text, micros)
            elif kind == "message" and self.on_message is not None:
                _, task, rank, data = event
                self.on_message(task if rank is None else rank, cloudpickle.loads(data))
            elif kind == "started":
                _, task, attempt, hostname, pid = event
                log.debug("task %d (attempt %d) started pid %d on %s", task, attempt, pid, hostname)
                self.on_started(task, attempt, hostname)
            elif kind == "exited":
                _, task, rank, success, description = event
                self.on_exited(task, rank, bool(success), str(description))
        for stream in (self.out, self.err):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass

    def on_started(self, task: int, attempt: int, hostname: str) -> None:
        """A task started its rank process (the elastic driver admits it here)."""

    def on_exited(self, task: int, rank: Optional[int], success: bool, description: str) -> None:
        """A task's rank process ended (the elastic driver removes or fails on it here)."""

    def write(
        self,
        stream: TextIO,
        task: int,
        rank: Optional[int],
        is_stderr: bool,
        text: bytes,
        micros: int,
    ) -> None:
        label = task if rank is None else rank
        prefix = f"[{label}]<{'stderr' if is_stderr else 'stdout'}>:"
        if self.timestamps:
            when = datetime.fromtimestamp(micros / 1e6).strftime("%a %b %d %H:%M:%S %Y")
            prefix = f"{when}{prefix}"
        try:
            stream.write(f"{prefix}{text.decode('utf-8', errors='replace')}\n")
        except (OSError, ValueError):
            pass

    def rank_failed(self, failure: tuple) -> RankFailedError:
        rank, host, message = failure
        task_index = None
        assignment = self.driver.assignment()
        if rank is not None and assignment is not None:
            task_index = next(
                (row["task_index"] for row in assignment if row["rank"] == rank), None
            )
        attempt = None
        if task_index is not None:
            start = self.driver.task_start(task_index)
            if start is not None:
                attempt, start_host, _ = start
                host = host or start_host
        where = f"rank {rank}" if rank is not None else "a rank"
        if host:
            where += f" on host {host}"
        if task_index is not None:
            where += f" (Spark task {task_index}, attempt {attempt})"
        text = (
            f"kolo.spark.run: {where} failed; the other ranks were stopped. Its error:\n{message}"
        )
        return RankFailedError(
            text,
            rank=rank,
            host=host,
            task_index=task_index,
            task_attempt=attempt,
            remote_traceback=message,
        )

    def stop(self, reason: Optional[str]) -> None:
        """Aborts the job, cancels the stage and waits (bounded) for every rank process."""
        if reason is not None and self.driver.failure() is None:
            self.driver.abort(reason)
        try:
            self.sc.cancelJobGroup(self.group)
        except Exception as error:  # the context may be stopping
            log.debug("cancelling job group %s: %s", self.group, error)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            self.pump(POLL_S)
            running = [
                t
                for t in range(self.num_proc)
                if self.driver.task_start(t) is not None and self.driver.task_exit(t) is None
            ]
            if not running and self.stage_done.is_set():
                return
        log.warning("kolo.spark.run: not every task confirmed its rank process stopped")

    def results(self) -> list[Any]:
        import cloudpickle

        assignment = self.driver.assignment()
        if assignment is None:
            raise LaunchError("kolo.spark.run: the ranks finished without a rank assignment")
        by_rank: list[Any] = [None] * self.num_proc
        for row in assignment:
            data = self.driver.result(row["task_index"])
            if data is None:
                exit_info = self.driver.task_exit(row["task_index"])
                raise RankFailedError(
                    f"kolo.spark.run: rank {row['rank']} on host {row['hostname']} ended "
                    f"without returning a result ({exit_info[1] if exit_info else 'no exit seen'})",
                    rank=row["rank"],
                    host=row["hostname"],
                    task_index=row["task_index"],
                )
            by_rank[row["rank"]] = cloudpickle.loads(data)
        return by_rank

    def close(self) -> None:
        self.driver.shutdown()
        if self.thread is not None:
            if not self.stage_done.wait(timeout=5.0):
                try:
                    self.sc.cancelJobGroup(self.group)
                except Exception:
                    pass
                self.stage_done.wait(timeout=10.0)


def _spark_message(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _active_spark_context() -> Any:
    try:
        from pyspark import SparkContext
    except ImportError as error:
        raise ConfigError(
            "kolo.spark.run needs PySpark: pip install pyspark (3.5 or 4.x)"
        ) from error
    sc = SparkContext._active_spark_context
    if sc is None:
        raise ConfigError(
            "kolo.spark.run needs an active SparkContext: create one first, e.g. "
            "SparkSession.builder.getOrCreate()"
        )
    return sc


def _check_num_proc(num_proc: Any) -> int:
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc <= 0:
        raise InvalidArgumentError(
            f"num_proc={num_proc!r} must be a positive int (the number of ranks); leave it "
            "unset for spark.sparkContext.defaultParallelism"
        )
    return num_proc


def _start_timeout(start_timeout: Optional[float]) -> float:
    if start_timeout is None:
        for name in START_TIMEOUT_VARS:
            if os.environ.get(name):
                try:
                    return float(os.environ[name])
                except ValueError:
                    raise ConfigError(
                        f"{name}={os.environ[name]!r} is not a number of seconds"
                    ) from None
        return DEFAULT_START_TIMEOUT_S
    if (
        isinstance(start_timeout, bool)
        or not isinstance(start_timeout, (int, float))
        or not (0 < start_timeout < 1e9)
    ):
        raise InvalidArgumentError(
            f"start_timeout={start_timeout!r} must be a positive number of seconds"
        )
    return float(start_timeout)


def _pickle_payload(fn: Any, args: tuple, kwargs: dict) -> bytes:
    if not callable(fn):
        raise InvalidArgumentError(f"fn must be callable, got {type(fn).__name__}")
    import cloudpickle

    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as error:
        raise InvalidArgumentError(
            f"kolo.spark.run cannot pickle fn, args or kwargs ({type(error).__name__}: {error}); "
            "everything the function uses must be picklable with cloudpickle: create "
            "locks, sockets, open files, Spark objects inside fn instead of capturing them"
        ) from error


def task_slots(sc: Any) -> Optional[int]:
    """How many tasks the cluster can run at once (``maxNumConcurrentTasks`` of the default
    resource profile, which accounts for ``spark.task.cpus`` and executor cores); None when it
    cannot be asked.

    Example::

        slots = task_slots(spark.sparkContext)
    """
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:
        pass
    try:
        return int(jsc.maxNumConcurrentTasks())  # Spark 3.0
    except Exception:
        return None


def _check_slots(sc: Any, num_proc: int) -> None:
    slots = task_slots(sc)
    if slots is None or slots >= num_proc:
        return
    if not str(sc.master).startswith("local"):
        # Executors may still be registering: give them a moment.
        wait = float(os.environ.get(SLOTS_WAIT_VAR, DEFAULT_SLOTS_WAIT_S))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(0.25)
            slots = task_slots(sc) or 0
            if slots >= num_proc:
                return
    cpus = sc.getConf().get("spark.task.cpus", "1")
    raise NotEnoughSlotsError(
        f"kolo.spark.run: num_proc={num_proc} needs {num_proc} task slots at once (a barrier "
        f"stage runs all its tasks together), but this Spark application has {slots} (master "
        f"{sc.master}, spark.task.cpus={cpus}). Use num_proc<={slots}, or give the application "
        "more executors or cores (spark.executor.instances, spark.executor.cores, more workers, "
        "or local[N] with N>=num_proc)."
    )


def _bind_ip(sc: Any, nics: Any) -> str:
    ip = nics_ip(nics)
    if ip is not None:
        return ip
    host = sc.getConf().get("spark.driver.host", None) or socket.gethostname()
    try:
        return socket.gethostbyname(host)
    except OSError as error:
        raise ConfigError(
            f"cannot resolve the Spark driver host {host!r} ({error}); set spark.driver.host "
            "to an address executors can reach, or pass nics=[...]"
        ) from error


# Horovod's module path: horovod.spark.runner.run_elastic (defined in its own module, which
# builds on the helpers above).
from kolo.spark._elastic import run_elastic  # noqa: E402
