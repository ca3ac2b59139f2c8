"""The driver side of :func:`kolo.spark.run_elastic` (Horovod's ``horovod.spark.run_elastic``).

The launch model (docs/elastic.md, "Spark"):

- One Spark job of ``max_num_proc`` *non-barrier* tasks (Horovod's choice: a failed barrier
  task makes Spark relaunch the whole stage, so the survivors could not keep running). Each
  task runs one rank process.
- Spark task attempt ``a`` of partition ``p`` is kolo task index ``p + a * max_num_proc``, so
  a retry is a new task (a new worker) and an index never names two processes. Partitions
  ``0 .. num_proc-1`` (attempt 0) are the job's first members; every other attempt is admitted
  (``LaunchDriver.add_tasks``) when its task reports that it started, while fewer than
  ``max_num_proc`` are live; otherwise it waits (its rank process retries joining) until a
  member leaves or its start timeout passes.
- A lost member leaves the job and the survivors reset and continue: when its rank process is
  killed by a signal on a live executor; about a second after its executor died (the task
  runner dies with it, and the job driver sees the runner's watch stream close without an exit
  report: collective/src/control/runner_watch.rs); at once when Spark starts the next attempt
  of its partition (Spark only retries a task after its attempt failed, so earlier attempts
  are dead; ``spark.speculation`` must therefore be off); or after the driver's heartbeat
  timeout (``KOLO_HEARTBEAT_TIMEOUT_SECONDS``, default 30 s) when nothing else tells (the
  executor's host cut off from the network).
- A rank process that exits with a non-zero status (the function raised outside
  ``hvd.elastic.run``'s recovery) fails the job with :class:`~kolo.exceptions.RankFailedError`.
- The job ends once a rank of the latest round returned and every rank of that round ended;
  the result is the list of that round's results ordered by rank (Horovod's rule).
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Optional, TextIO

from kolo.exceptions import ConfigError, InvalidArgumentError, LaunchError, RankFailedError
from kolo.spark._driver_job import (
    POLL_S,
    STOP_WAIT_S,
    TASK_ROW_SCHEMA,
    TERM_GRACE_S,
    _bind_ip,
    _check_num_proc,
    _check_slots,
    _Job,
    _pickle_payload,
    _spark_message,
    _start_timeout,
    abort_and_cancel,
    log,
)
from kolo.spark._python_probe import PROBE_TIMEOUT_S, check_executor_python
from kolo.spark._session import spark_target

__all__ = ["run_elastic"]

#: Horovod's default elastic timeout (seconds) and the variables that override it.
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
ELASTIC_TIMEOUT_VARS = ("KOLO_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT")
#: Seconds without a heartbeat after which the job driver declares a rank lost.
HEARTBEAT_TIMEOUT_VAR = "KOLO_HEARTBEAT_TIMEOUT_SECONDS"
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0
#: The job driver's bound on task indices (``MAX_TASKS`` in collective/src/control/service.rs).
MAX_TASK_INDICES = 1 << 20
#: How the exit the job driver records for a task lost with its runner starts
#: (``LOST_WITH_RUNNER`` in collective/src/control/runner_watch.rs).
LOST_WITH_RUNNER = "was lost with its task runner"
#: How many stderr lines of each rank the driver keeps for a failure's report.
STDERR_TAIL_LINES = 60


def run_elastic(
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: Optional[dict] = None,
    num_proc: Optional[int] = None,
    min_num_proc: Optional[int] = None,
    max_num_proc: Optional[int] = None,
    start_timeout: Optional[float] = None,
    elastic_timeout: Optional[float] = None,
    reset_limit: Optional[int] = None,
    env: Optional[dict[str, str]] = None,
    stdout: Optional[TextIO] = None,
    stderr: Optional[TextIO] = None,
    verbose: int = 1,
    nics: Optional[Any] = None,
    prefix_output_with_timestamp: bool = False,
    min_np: Optional[int] = None,
    max_np: Optional[int] = None,
    *,
    spark: Any = None,
    _on_message: Optional[Callable[[int, Any], None]] = None,
) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` as an elastic job on Spark tasks (Horovod's
    ``horovod.spark.run_elastic``) and returns the results of the last round's ranks, ordered
    by rank.

    ``fn`` is an elastic training function: it wraps its loop in ``hvd.elastic.run`` with a
    state it commits (see docs/elastic.md). The job starts ``max_num_proc`` non-barrier Spark
    tasks, one rank each; ``num_proc`` of them form the first round. When a rank is lost (its
    executor died, its process was killed) the others restore their last commit and continue
    without it while Spark retries the lost task; the retry joins as a new worker, as do tasks
    that start later (executors added by dynamic allocation), up to ``max_num_proc`` ranks.
    Fewer than ``min_num_proc`` ranks for longer than ``elastic_timeout`` stops the job.

    Each Spark task attempt is one kolo task: attempt ``a`` of partition ``p`` has task index
    ``p + a * max_num_proc``. ``spark.speculation`` must be off (two live attempts of one
    partition would be one worker twice). Spark retries a task lost with its executor up to
    ``spark.task.maxFailures`` times (default 4; local mode retries nothing unless the master is
    ``local[N, F]``).

    Args:
        fn: the function every rank runs (picklable with cloudpickle).
        args: its positional arguments.
        kwargs: its keyword arguments.
        num_proc: the ranks of the first round; default ``spark.sparkContext.defaultParallelism``.
        min_num_proc: the fewest ranks training continues with; default ``num_proc``.
        max_num_proc: the most ranks (and the number of Spark tasks); default ``num_proc``.
        start_timeout: seconds for the first ``num_proc`` tasks to start and register (and
            for a later task to be admitted); default 600 (``KOLO_SPARK_START_TIMEOUT`` /
            ``HOROVOD_SPARK_START_TIMEOUT``).
        elastic_timeout: seconds the job may have fewer than ``min_num_proc`` ranks, and a
            round after a reset may take to gather; default 600 (``KOLO_ELASTIC_TIMEOUT`` /
            ``HOROVOD_ELASTIC_TIMEOUT``).
        reset_limit: the most resets the job goes through; the one after stops it with
            :class:`~kolo.exceptions.RankFailedError` naming the limit. Default: no limit.
        env: variables added to every rank process's environment.
        stdout: where the ranks' standard output goes (default ``sys.stdout``).
        stderr: where the ranks' standard error goes (default ``sys.stderr``).
        verbose: 0 quiet, 1 launch summary in the log, 2 progress of the launch on stderr.
        nics: network interface name(s) the driver service listens on.
        prefix_output_with_timestamp: put the time each line was read before its prefix.
        min_np: deprecated alias of ``min_num_proc`` (a ``DeprecationWarning``, as in Horovod).
        max_np: deprecated alias of ``max_num_proc``.
        spark: the session to run on (classic or Spark Connect ``SparkSession``, or a
            ``SparkContext``); default the active ``SparkContext``, else the active Spark
            Connect session (there the tasks are a ``mapInArrow`` stage on ``spark.range``).
        _on_message: called on the driver with ``(rank, obj)`` for each
            :func:`kolo.spark.task.send_to_driver` of a rank.

    Raises:
        InvalidArgumentError: a bad argument (before any Spark job starts).
        ConfigError: no active Spark session, ``spark.speculation`` on, or executors whose
            Python cannot import kolo.
        NotEnoughSlotsError: fewer task slots than ``num_proc`` (without dynamic allocation).
        RankFailedError: a rank's function raised, or the job stopped (reset limit, fewer than
            ``min_num_proc`` ranks for ``elastic_timeout``).

    Example::

        import kolo.spark

        def train(epochs):
            import torch
            import kolo.torch as hvd

            hvd.init()
            state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0)

            @hvd.elastic.run
            def loop(state):
                while state.epoch < epochs:
                    hvd.allreduce(torch.ones(1))
                    state.epoch += 1
                    state.commit()
                return hvd.rank(), hvd.size()

            return loop(state)

        kolo.spark.run_elastic(train, args=(5,), num_proc=2, min_num_proc=1, max_num_proc=3)
    """
    kwargs = {} if kwargs is None else kwargs
    if min_np is not None:
        warnings.warn(
            "min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2
        )
        min_num_proc = min_np
    if max_np is not None:
        warnings.warn(
            "max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2
        )
        max_num_proc = max_np
    target = spark_target(spark)
    num_proc = _check_num_proc(target.default_parallelism() if num_proc is None else num_proc)
    min_num_proc = _check_bound("min_num_proc", num_proc if min_num_proc is None else min_num_proc)
    max_num_proc = _check_bound("max_num_proc", num_proc if max_num_proc is None else max_num_proc)
    if not min_num_proc <= num_proc <= max_num_proc:
        raise InvalidArgumentError(
            f"run_elastic needs min_num_proc <= num_proc <= max_num_proc, got min_num_proc="
            f"{min_num_proc}, num_proc={num_proc}, max_num_proc={max_num_proc}"
        )
    start_timeout_s = _start_timeout(start_timeout)
    elastic_timeout_s = _elastic_timeout(elastic_timeout)
    if reset_limit is not None and (
        isinstance(reset_limit, bool) or not isinstance(reset_limit, int) or reset_limit < 0
    ):
        raise InvalidArgumentError(
            f"reset_limit={reset_limit!r} must be a whole number >= 0 (the most resets), or None "
            "for no limit"
        )
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
    if (target.conf("spark.speculation", "false") or "").strip().lower() == "true":
        raise ConfigError(
            "kolo.spark.run_elastic cannot run with spark.speculation=true: a speculative copy "
            "of a task would be a second worker for the same slot. Turn speculation off for "
            "this application."
        )
    max_attempts = _max_task_attempts(target)
    if max_num_proc * max_attempts > MAX_TASK_INDICES:
        raise InvalidArgumentError(
            f"max_num_proc={max_num_proc} with spark.task.maxFailures={max_attempts} needs "
            f"{max_num_proc * max_attempts} task indices, more than kolo supports "
            f"({MAX_TASK_INDICES}); lower max_num_proc or spark.task.maxFailures"
        )
    payload = _pickle_payload(fn, tuple(args), kwargs)
    dynamic = target.conf("spark.dynamicAllocation.enabled", "false") or ""
    if dynamic.strip().lower() != "true":
        _check_slots(target, num_proc)
    check_executor_python(target, num_proc, min(start_timeout_s, PROBE_TIMEOUT_S))
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    bind_ip = _bind_ip(target, nics)

    from kolo import _native

    launched = time.monotonic()
    driver = _native.LaunchDriver(
        num_proc,
        f"{bind_ip}:0",
        start_timeout_s,
        heartbeat_timeout=_heartbeat_timeout(),
        min_np=min_num_proc,
        max_np=max_num_proc,
        elastic_timeout=elastic_timeout_s,
        reset_limit=reset_limit,
    )
    job = _ElasticJob(
        target, driver, num_proc, max_num_proc, out, err, prefix_output_with_timestamp, _on_message
    )
    try:
        driver.put_payload(payload)
        job_env = dict(driver.worker_env(0))
        job_env.pop("KOLO_TASK_INDEX", None)
        task_fn = functools.partial(
            _elastic_task_entry(),
            job_env,
            dict(env or {}),
            None,
            TERM_GRACE_S,
            max_num_proc,
        )
        if verbose >= 2:
            print(
                f"kolo.spark.run_elastic: starting {max_num_proc} Spark task(s) for {num_proc} "
                f"rank(s) (min {min_num_proc}, max {max_num_proc}); job driver at {driver.addr}",
                file=err,
            )
        job.start_stage(task_fn)
        job.wait()
        results = job.results()
        log.info(
            "kolo.spark.run_elastic: %d rank(s) finished in %.1fs after %d reset(s)%s",
            len(results),
            time.monotonic() - launched,
            job.resets,
            ""
            if job.cluster is None
            else f"; discovery: {job.discovered['added']} executor(s) added, "
            f"{job.discovered['removed']} removed",
        )
        return results
    except KeyboardInterrupt:
        job.stop("kolo.spark.run_elastic was interrupted on the driver (Ctrl-C)")
        raise
    except BaseException:
        job.stop("kolo.spark.run_elastic failed on the driver")
        raise
    finally:
        job.close()


def _elastic_task_entry() -> Callable[..., Any]:
    from kolo.spark.task import _run_elastic_task

    return _run_elastic_task


def _check_bound(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(f"{name}={value!r} must be a positive int (a number of ranks)")
    return value


def _elastic_timeout(elastic_timeout: Optional[float]) -> float:
    if elastic_timeout is None:
        for name in ELASTIC_TIMEOUT_VARS:
            if os.environ.get(name):
                try:
                    value = float(os.environ[name])
                except ValueError:
                    raise ConfigError(
                        f"{name}={os.environ[name]!r} is not a number of seconds"
                    ) from None
                if not 0 < value < 1e9:
                    raise ConfigError(f"{name}={os.environ[name]!r} must be positive seconds")
                return value
        return DEFAULT_ELASTIC_TIMEOUT_S
    if (
        isinstance(elastic_timeout, bool)
        or not isinstance(elastic_timeout, (int, float))
        or not (0 < elastic_timeout < 1e9)
    ):
        raise InvalidArgumentError(
            f"elastic_timeout={elastic_timeout!r} must be a positive number of seconds"
        )
    return float(elastic_timeout)


def _heartbeat_timeout() -> float:
    text = os.environ.get(HEARTBEAT_TIMEOUT_VAR)
    if not text:
        return DEFAULT_HEARTBEAT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{HEARTBEAT_TIMEOUT_VAR}={text!r} is not a number of seconds") from None
    if not 0 < value < 1e9:
        raise ConfigError(f"{HEARTBEAT_TIMEOUT_VAR}={text!r} must be positive seconds")
    return value


def _max_task_attempts(target: Any) -> int:
    """How many attempts Spark gives one task: ``local[N, F]``'s F in local mode (1 for
    ``local[N]``), else ``spark.task.maxFailures`` (default 4)."""
    target = spark_target(target)
    master = target.master
    if master.startswith("local"):
        inside = master[master.find("[") + 1 : master.rfind("]")] if "[" in master else ""
        parts = [part.strip() for part in inside.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            return max(1, int(parts[1]))
        return 1
    try:
        return max(1, int(target.conf("spark.task.maxFailures", "4") or "4"))
    except ValueError:
        return 4


class _ElasticJob(_Job):
    """One elastic launch: the non-barrier Spark job in a background thread and the driver
    loop that admits, removes and finishes tasks."""

    def __init__(
        self,
        target: Any,
        driver: Any,
        num_proc: int,
        max_num_proc: int,
        out: TextIO,
        err: TextIO,
        timestamps: bool,
        on_message: Optional[Callable[[int, Any], None]],
    ) -> None:
        super().__init__(target, driver, num_proc, out, err, timestamps, on_message)
        self.group = self.group.replace("kolo.spark.run-", "kolo.spark.run_elastic-")
        self.max_num_proc = max_num_proc
        #: ``(attempt, hostname)`` of every task whose rank process started.
        self.starts: dict[int, tuple[int, str]] = {}
        #: Started tasks waiting for room (``max_num_proc`` live), oldest first.
        self.pending: list[int] = []
        self.live: set[int] = set(range(num_proc))
        #: Every task that was ever a member, and those this launcher removed.
        self.admitted: set[int] = set(range(num_proc))
        self.dropped: set[int] = set()
        #: A live task's rank returned: nothing is admitted any more.
        self.finishing = False
        self.failed: Optional[RankFailedError] = None
        self.stderr_tail: dict[int, collections.deque] = {}
        #: Distinct rank assignments seen (the first round and one per reset).
        self.rounds = 0
        #: Executors added and removed, as the kolo Spark plugin reported them (discovery).
        self.discovered: collections.Counter = collections.Counter()

    @property
    def resets(self) -> int:
        """How many rounds after the first this launch saw (for its summary)."""
        return max(0, self.rounds - 1)

    def start_stage(self, task_fn: Callable[..., Any]) -> None:
        def stage() -> None:
            try:
                self.target.run_tasks(
                    task_fn,
                    self.max_num_proc,
                    self.group,
                    "kolo.spark.run_elastic",
                    TASK_ROW_SCHEMA,
                    barrier=False,
                )
            except BaseException as error:
                self.stage_error = error
            finally:
                self.stage_done.set()

        self.thread = threading.Thread(target=stage, name="kolo-spark-elastic", daemon=True)
        self.thread.start()

    # -- events -----------------------------------------------------------------------------

    def on_started(self, task: int, attempt: int, hostname: str) -> None:
        # Kept here: the driver forgets a task's start when it is added (a new process).
        self.starts[task] = (attempt, hostname)
        partition = task % self.max_num_proc
        for earlier in range(task % self.max_num_proc, task, self.max_num_proc):
            if earlier in self.live:
                self.remove(
                    earlier,
                    f"its Spark task (partition {partition}, attempt {earlier // self.max_num_proc}"
                    f") was lost: Spark started attempt {attempt} of the partition",
                )
        if task in self.live or self.finishing:
            return
        self.pending.append(task)
        self.admit()

    def on_exited(self, task: int, rank: Optional[int], success: bool, description: str) -> None:
        if task in self.pending:
            self.pending.remove(task)
        if task not in self.admitted or task in self.dropped:
            # Never admitted (it gave up waiting for room), or removed by this launcher.
            return
        if success:
            self.finishing = True
            return
        if self.finishing or description.startswith("stopped"):
            return
        if "signal" in description or description.startswith(LOST_WITH_RUNNER):
            # Killed (OOM killer), or lost with its executor (the driver saw the task runner's
            # watch close without an exit): the others continue.
            log.warning(
                "kolo.spark.run_elastic: the rank process of task %d %s; the other ranks "
                "continue without it",
                task,
                description,
            )
            self.remove(task, f"its rank process {description}")
            return
        # The function raised outside the elastic loop's recovery: the job fails, as
        # kolo.spark.run does.
        self.failed = self.rank_failed_from_exit(task, rank, description)

    def write(
        self,
        stream: TextIO,
        task: int,
        rank: Optional[int],
        is_stderr: bool,
        text: bytes,
        micros: int,
    ) -> None:
        if is_stderr:
            tail = self.stderr_tail.setdefault(task, collections.deque(maxlen=STDERR_TAIL_LINES))
            tail.append(text.decode("utf-8", errors="replace"))
        super().write(stream, task, rank, is_stderr, text, micros)

    # -- membership -------------------------------------------------------------------------

    def remove(self, task: int, reason: str) -> None:
        if self.driver.remove_task(task, reason):
            log.warning("kolo.spark.run_elastic: task %d left the job: %s", task, reason)
        self.live.discard(task)
        self.dropped.add(task)

    def admit(self) -> None:
        while self.pending and not self.finishing and len(self.live) < self.max_num_proc:
            task = self.pending.pop(0)
            if self.driver.task_exit(task) is not None:
                continue
            self.driver.add_tasks([task])
            self.live.add(task)
            self.admitted.add(task)
            log.info(
                "kolo.spark.run_elastic: task %d (partition %d, attempt %d) joins the job",
                task,
                task % self.max_num_proc,
                task // self.max_num_proc,
            )

    def discover(self) -> None:
        """Executors added and removed, from the kolo Spark plugin when it is on (a discovery
        source Horovod left as a TODO on Spark): logs and counts them; a removed executor's
        tasks leave the job at once, before heartbeats or the task-runner watch tell."""
        if self.cluster is None:
            return
        self.cluster.poll()
        for change in self.cluster.take_changes():
            self.discovered["added" if change.added else "removed"] += 1
            if change.added:
                log.info(
                    "kolo.spark.run_elastic: discovery: executor %s added on host %s",
                    change.executor_id,
                    change.host,
                )
            else:
                log.info(
                    "kolo.spark.run_elastic: discovery: executor %s removed (host %s): %s",
                    change.executor_id,
                    change.host,
                    change.reason,
                )
        for lost in self.cluster.take_lost():
            for partition, attempt in lost.partitions:
                task = partition + attempt * self.max_num_proc
                if task in self.live:
                    self.remove(task, f"Spark {lost.describe()}")

    def sync_live(self) -> None:
        """Takes the driver's view (it removes tasks whose heartbeats stopped or that reported
        a failure) and lets waiting tasks in."""
        live = set(self.driver.live_tasks())
        for task in sorted(self.live - live):
            log.warning(
                "kolo.spark.run_elastic: task %d left the job (a failure report, its task "
                "runner lost, or lost heartbeats)",
                task,
            )
        self.live = live
        self.admit()

    # -- the loop ---------------------------------------------------------------------------

    def wait(self) -> None:
        """Runs the driver loop until every rank of the latest round ended; raises on a failure."""
        last_assignment: Optional[tuple] = None
        while True:
            self.pump(POLL_S)
            failure = self.driver.failure()
            if failure is not None:
                self.stop(None)
                raise self.rank_failed(failure)
            if self.failed is not None:
                error = self.failed
                self.stop(str(error))
                raise error
            self.discover()
            self.sync_live()
            assignment = self.driver.assignment()
            if assignment is not None:
                key = tuple(sorted((row["rank"], row["task_index"]) for row in assignment))
                if key != last_assignment:
                    last_assignment = key
                    self.rounds += 1
                    log.info(
                        "kolo.spark.run_elastic: round of %d rank(s): tasks %s",
                        len(key),
                        [task for _, task in key],
                    )
                if self.finishing and self.round_ended(assignment):
                    return
            if self.stage_done.is_set():
                self.pump(0.5)
                assignment = self.driver.assignment()
                if self.driver.failure() is not None or self.failed is not None:
                    continue
                if assignment is not None and self.finishing and self.round_ended(assignment):
                    return
                raise LaunchError(
                    "the Spark job of kolo.spark.run_elastic ended before the ranks finished: "
                    f"{_spark_message(self.stage_error) if self.stage_error else 'no error'}"
                ) from self.stage_error

    def round_ended(self, assignment: list) -> bool:
        return all(
            self.driver.task_exit(row["task_index"]) is not None
            or row["task_index"] not in self.live
            for row in assignment
        )

    def rank_failed_from_exit(
        self, task: int, rank: Optional[int], description: str
    ) -> RankFailedError:
        attempt, host = self.starts.get(task, (None, None))
        tail = "\n".join(self.stderr_tail.get(task, ()))
        where = f"rank {rank}" if rank is not None else f"task {task}"
        if host:
            where += f" on host {host}"
        where += f" (Spark partition {task % self.max_num_proc}, attempt {attempt})"
        return RankFailedError(
            f"kolo.spark.run_elastic: {where} {description}; the other ranks were stopped. "
            f"Its last error output:\n{tail}",
            rank=rank,
            host=host,
            task_index=task,
            task_attempt=attempt,
            remote_traceback=tail,
        )

    def stop(self, reason: Optional[str]) -> None:
        abort_and_cancel(self.driver, self.target, self.group, reason)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            self.pump(POLL_S)
            if self.stage_done.is_set():
                return
        log.warning("kolo.spark.run_elastic: not every task confirmed its rank process stopped")

    def results(self) -> list[Any]:
        import cloudpickle

        assignment = self.driver.assignment()
        if assignment is None:
            raise LaunchError("kolo.spark.run_elastic: the ranks finished without a round")
        by_rank: list[Any] = [None] * len(assignment)
        for row in assignment:
            data = self.driver.result(row["task_index"])
            by_rank[row["rank"]] = None if data is None else cloudpickle.loads(data)
        return by_rank

    def close(self) -> None:
        # The job is over: pending partitions (no slot yet) must not start, and waiting tasks
        # stop their rank processes once the driver is gone.
        try:
            self.target.cancel(self.group)
        except Exception:
            pass
        super().close()
