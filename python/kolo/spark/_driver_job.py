"""What :func:`kolo.spark.run` and :func:`kolo.spark.run_elastic` share on the driver: the
Spark job in a background thread with the driver loop (``_Job``), and the argument, slot and
address checks."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime
from typing import Any, Callable, Optional, TextIO

from kolo._launch_times import decode_rank_times, is_rank_times
from kolo._nics import nics_ip
from kolo.exceptions import (
    ConfigError,
    InvalidArgumentError,
    LaunchError,
    NotEnoughSlotsError,
    RankFailedError,
)
from kolo.spark._jvm_events import executor_lost_error, open_job_events
from kolo.spark._launch_report import LaunchReport
from kolo.spark._session import spark_target

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
#: The row each launch task returns to Spark: its index, whether its rank process succeeded,
#: and how it ended (the Connect path's ``mapInArrow`` schema).
TASK_ROW_SCHEMA = "index long, success boolean, description string"
#: ``kolo.spark.run``'s task row: the same, and when the task started (unix seconds; for the
#: launch report).
RUN_TASK_ROW_SCHEMA = f"{TASK_ROW_SCHEMA}, started_unix double"
#: When a rank fails and the kolo Spark plugin is on, how long the driver waits for Spark to say
#: whether an executor of the launch was lost (the failure's cause, named in the error).
CAUSE_GRACE_S = 1.0


def abort_and_cancel(driver: Any, target: Any, group: str, reason: Optional[str]) -> None:
    """Aborts the job's driver with ``reason`` (unless it already failed, or ``reason`` is None)
    and cancels its Spark job (a classic job group, or the Connect operations tagged
    ``group``): the first half of stopping a launch."""
    if reason is not None and driver.failure() is None:
        driver.abort(reason)
    try:
        target.cancel(group)
    except Exception as error:  # the context may be stopping
        log.debug("cancelling Spark job %s: %s", group, error)


class _Job:
    """One launch: the Spark stage in a background thread and the driver loop."""

    def __init__(
        self,
        target: Any,
        driver: Any,
        num_proc: int,
        out: TextIO,
        err: TextIO,
        timestamps: bool,
        on_message: Optional[Callable[[int, Any], None]],
    ) -> None:
        self.target = spark_target(target)
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
        # The kolo Spark plugin's events when its jar is on the driver (else None; always None
        # on Spark Connect, where this process has no JVM).
        self.cluster = open_job_events(getattr(self.target, "sc", None), lambda: self.group)
        #: Tasks whose executor Spark reported lost: no exit report will come from them.
        self.gone: set[int] = set()
        #: The launch's recorded times (set by ``kolo.spark.run``; the ranks' arrive here).
        self.report: Optional[LaunchReport] = None
        #: The stage's rows, once it returned.
        self.stage_rows: list[tuple] = []

    def start_stage(self, task_fn: Callable[..., Any], schema: str = TASK_ROW_SCHEMA) -> None:
        def stage() -> None:
            try:
                self.stage_rows = self.target.run_tasks(
                    task_fn,
                    self.num_proc,
                    self.group,
                    "kolo.spark.run",
                    schema,
                    barrier=True,
                )
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
            lost = self.executor_lost(CAUSE_GRACE_S if self.driver.failure() else 0.0)
            if lost is not None:
                log.warning("kolo.spark.run: Spark %s; stopping the other ranks", lost.describe())
                self.gone.update(partition for partition, _ in lost.partitions)
                self.stop(f"Spark {lost.describe()}")
                raise executor_lost_error(lost, self.driver)
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
            elif kind == "message":
                _, task, rank, data = event
                if is_rank_times(data):
                    if self.report is not None:
                        self.report.ranks[task] = decode_rank_times(data)
                elif self.on_message is not None:
                    self.on_message(task if rank is None else rank, cloudpickle.loads(data))
            elif kind == "started":
                _, task, attempt, hostname, pid = event
                log.debug("task %d (attempt %d) started pid %d on %s", task, attempt, pid, hostname)
                self.on_started(task, attempt, hostname)
            elif kind == "exited":
                _, task, rank, success, description = event
                log.debug("task %d (rank %s) exited: %s", task, rank, description)
                self.on_exited(task, rank, bool(success), str(description))
        for stream in (self.out, self.err):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass

    def executor_lost(self, grace: float) -> Any:
        """The first executor of this launch Spark reported lost (through the kolo Spark
        plugin), waiting up to ``grace`` seconds for one; None without the plugin."""
        if self.cluster is None:
            return None
        deadline = time.monotonic() + grace
        while True:
            self.cluster.poll()
            lost = self.cluster.take_lost()
            if lost or time.monotonic() >= deadline:
                return lost[0] if lost else None
            time.sleep(POLL_S / 2)

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
        abort_and_cancel(self.driver, self.target, self.group, reason)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            self.pump(POLL_S)
            running = [
                t
                for t in range(self.num_proc)
                if self.driver.task_start(t) is not None
                and self.driver.task_exit(t) is None
                and t not in self.gone
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
        if self.cluster is not None:
            self.cluster.close()
        if self.thread is not None:
            if not self.stage_done.wait(timeout=5.0):
                try:
                    self.target.cancel(self.group)
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
    """How many tasks the cluster can run at once; None when it cannot be asked. On a classic
    ``SparkContext`` (or session): ``maxNumConcurrentTasks`` of the default resource profile,
    which accounts for ``spark.task.cpus`` and executor cores; on a Spark Connect session:
    what the server's configuration promises (``local[N]``, executor instances x cores).

    Example::

        slots = task_slots(spark.sparkContext)
    """
    return spark_target(sc).task_slots()


def _check_slots(target: Any, num_proc: int) -> None:
    target = spark_target(target)
    slots = target.task_slots()
    if slots is None or slots >= num_proc:
        return
    if target.slots_may_grow and not target.master.startswith("local"):
        # Executors may still be registering: give them a moment.
        wait = float(os.environ.get(SLOTS_WAIT_VAR, DEFAULT_SLOTS_WAIT_S))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(0.25)
            slots = target.task_slots() or 0
            if slots >= num_proc:
                return
    cpus = target.conf("spark.task.cpus", "1") or "1"
    raise NotEnoughSlotsError(
        f"kolo.spark.run: num_proc={num_proc} needs {num_proc} task slots at once (a barrier "
        f"stage runs all its tasks together), but this Spark application has {slots} (master "
        f"{target.master}, spark.task.cpus={cpus}). Use num_proc<={slots}, or give the application "
        "more executors or cores (spark.executor.instances, spark.executor.cores, more workers, "
        "or local[N] with N>=num_proc)."
    )


def _bind_ip(target: Any, nics: Any) -> str:
    """The address the job driver service listens on: ``nics``' address when given, else
    the address executors reach this process at (classic: ``spark.driver.host``; Connect: this
    client's address on the route to the Connect server)."""
    ip = nics_ip(nics)
    if ip is not None:
        return ip
    target = spark_target(target)
    host = target.driver_host()
    try:
        return socket.gethostbyname(host)
    except OSError as error:
        what = "this Spark Connect client's host" if target.is_connect else "the Spark driver host"
        raise ConfigError(
            f"cannot resolve {what} {host!r} ({error}); set spark.driver.host (classic) to an "
            "address executors can reach, or pass nics=[...]"
        ) from error
