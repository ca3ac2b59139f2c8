"""The one place kolo.spark tells a classic Spark application from a Spark Connect client.

A launch (``kolo.spark.run``, ``run_elastic``, the estimators' ``fit``) needs only a few things
of Spark: the default number of ranks, the cluster's task slots, a configuration value, an
application id, the executors' Python, the address executors reach this process at, a Spark
job of N tasks (barrier or not) that can be cancelled, and that job's rows.
:class:`ClassicSpark` does them with the ``SparkContext`` (a barrier RDD stage, job groups);
:class:`ConnectSpark` with a Spark Connect ``SparkSession``, which has no ``SparkContext``
(a ``mapInArrow`` stage on ``spark.range(n, numPartitions=n)``, operation tags and
``interruptTag``). :func:`spark_target` picks one.

Example::

    target = spark_target()                 # the active session: classic or Connect
    rows = target.run_tasks(fn, 2, "kolo-job-1", "kolo: probe", ROW_SCHEMA, barrier=True)
"""

from __future__ import annotations

import functools
import logging
import re
import socket
import sys
import types
from typing import Any, Callable, Iterable, Iterator, Optional

from kolo.exceptions import ConfigError

log = logging.getLogger("kolo.spark")

#: A task's function: the partition's items in, the task's rows (tuples) out.
TaskFn = Callable[[Iterable[Any]], Iterator[tuple]]

_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER_MASTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def by_value(fn: types.FunctionType, **helpers: Any) -> types.FunctionType:
    """A copy of ``fn`` that cloudpickle ships by value (not as ``kolo...`` by reference), so
    unpickling it on an executor needs no kolo; ``helpers`` are the only globals it sees.

    Example::

        probe = by_value(_probe)
    """
    copy = types.FunctionType(
        fn.__code__, {"__builtins__": __builtins__, **helpers}, fn.__name__, fn.__defaults__
    )
    copy.__module__ = "__main__"
    copy.__qualname__ = fn.__name__
    return copy


class ClassicSpark:
    """A classic Spark application (this process is its driver): the ``SparkContext``."""

    is_connect = False

    def __init__(self, sc: Any) -> None:
        self.sc = sc

    def default_parallelism(self) -> int:
        """``sc.defaultParallelism``."""
        return int(self.sc.defaultParallelism)

    @property
    def master(self) -> str:
        return str(self.sc.master)

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        return self.sc.getConf().get(key, default)

    def app_id(self) -> str:
        return str(self.sc.applicationId)

    def executor_python(self) -> str:
        return str(getattr(self.sc, "pythonExec", None) or "python3")

    def task_slots(self) -> Optional[int]:
        """``maxNumConcurrentTasks`` of the default resource profile (accounts for
        ``spark.task.cpus`` and executor cores); None when it cannot be asked."""
        jsc = self.sc._jsc.sc()
        try:
            profile = jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(profile))
        except Exception:
            pass
        try:
            return int(jsc.maxNumConcurrentTasks())  # Spark 3.0
        except Exception:
            return None

    #: Executors register over time: a short slot count may grow (``_check_slots`` waits).
    slots_may_grow = True

    def driver_host(self) -> str:
        """The host executors reach the Spark driver (this process) at."""
        return self.conf("spark.driver.host", None) or socket.gethostname()

    def run_tasks(
        self,
        fn: TaskFn,
        num_tasks: int,
        group: str,
        description: str,
        schema: str,
        barrier: bool,
    ) -> list[tuple]:
        """Runs ``fn`` on ``num_tasks`` tasks (one partition each) as job group ``group`` and
        returns their rows; blocks (call it from a thread that :meth:`cancel` may stop)."""
        del schema  # the RDD path returns Python tuples as they are
        self.sc.setJobGroup(group, description, interruptOnCancel=True)
        rdd = self.sc.parallelize(range(num_tasks), num_tasks)
        if barrier:
            return rdd.barrier().mapPartitions(fn).collect()
        return rdd.mapPartitions(fn).collect()

    def cancel(self, group: str) -> None:
        """Cancels the job of :meth:`run_tasks` with ``group`` (its tasks are interrupted)."""
        self.sc.cancelJobGroup(group)


class ConnectSpark:
    """A Spark Connect client session: no ``SparkContext`` here; jobs are DataFrame operations
    on the server, cancelled through operation tags."""

    is_connect = True
    #: Slots come from the server's configuration, which does not change during a launch.
    slots_may_grow = False

    def __init__(self, session: Any) -> None:
        import inspect

        from pyspark.sql.connect.dataframe import DataFrame

        if "barrier" not in inspect.signature(DataFrame.mapInArrow).parameters or not hasattr(
            session, "interruptTag"
        ):
            import pyspark

            raise ConfigError(
                f"kolo.spark on Spark Connect needs PySpark 4.0 or newer (this is "
                f"{pyspark.__version__}: its Connect DataFrame.mapInArrow has no barrier mode or "
                "its session no interruptTag); upgrade the client's pyspark"
            )
        self.session = session

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        try:
            value = self.session.conf.get(key, None)
        except Exception as error:  # a configuration the server refuses to show
            log.debug("spark.conf.get(%s) on Spark Connect: %s", key, error)
            value = None
        return default if value is None else str(value)

    @property
    def master(self) -> str:
        return self.conf("spark.master", "") or ""

    def app_id(self) -> str:
        return self.conf("spark.app.id", None) or f"connect:{self.url()}"

    def executor_python(self) -> str:
        return self.conf("spark.pyspark.python", None) or "the Connect server's PYSPARK_PYTHON"

    def server(self) -> tuple[str, int]:
        """The Connect server's host and port, as this client dials them."""
        builder = self.session.client._builder
        try:
            host, _, port = str(builder.endpoint).rpartition(":")
            return host.strip("[]"), int(port)
        except Exception:  # a custom channel builder without an endpoint
            return str(getattr(builder, "host", "localhost")), 15002

    def url(self) -> str:
        host, port = self.server()
        return f"sc://{host}:{port}"

    def _task_cpus(self) -> int:
        try:
            return max(1, int(self.conf("spark.task.cpus", "1") or "1"))
        except ValueError:
            return 1

    def task_slots(self) -> Optional[int]:
        """The task slots the server's configuration promises: ``local[N]`` → N,
        ``local-cluster[n, c, m]`` → n*c, otherwise ``spark.executor.instances`` times
        ``spark.executor.cores`` without dynamic allocation (each divided by
        ``spark.task.cpus``); None when the configuration does not say (``local[*]``,
        dynamic allocation, unset cores)."""
        master = self.master.replace(" ", "")
        cpus = self._task_cpus()
        local = _LOCAL_MASTER.match(master)
        if local:
            threads = local.group(1) or "1"
            return None if threads == "*" else int(threads) // cpus
        cluster = _LOCAL_CLUSTER_MASTER.match(master)
        if cluster:
            return int(cluster.group(1)) * (int(cluster.group(2)) // cpus)
        if (self.conf("spark.dynamicAllocation.enabled", "false") or "").lower() == "true":
            return None
        instances, cores = (
            self.conf("spark.executor.instances"),
            self.conf("spark.executor.cores"),
        )
        if instances is None or cores is None:
            return None
        try:
            return int(instances) * (int(cores) // cpus)
        except ValueError:
            return None

    def default_parallelism(self) -> int:
        """``spark.default.parallelism`` of the server, else its task slots; ConfigError when
        neither is known (then ``num_proc`` must be given)."""
        value = self.conf("spark.default.parallelism", None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ConfigError(
                    f"spark.default.parallelism={value!r} of the Spark Connect server is not "
                    "a number; pass num_proc"
                ) from None
        slots = self.task_slots()
        if slots:
            return slots
        raise ConfigError(
            "kolo.spark: this Spark Connect session does not say how many tasks it runs at once "
            f"(spark.master={self.master!r}, no spark.default.parallelism): pass num_proc=N"
        )

    def driver_host(self) -> str:
        """The address of this client on the route to the Connect server: the executors reach
        the job driver service here (on Connect the Spark driver is the server, not us)."""
        host, port = self.server()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((socket.gethostbyname(host), port))  # no packet is sent
                return probe.getsockname()[0]
        except OSError as error:
            log.debug("route to the Spark Connect server %s:%s: %s", host, port, error)
            return socket.gethostname()

    def run_tasks(
        self,
        fn: TaskFn,
        num_tasks: int,
        group: str,
        description: str,
        schema: str,
        barrier: bool,
    ) -> list[tuple]:
        """Runs ``fn`` on ``num_tasks`` tasks through ``mapInArrow`` on
        ``spark.range(num_tasks, numPartitions=num_tasks)`` (``barrier`` as asked), tagged
        ``group`` in this thread (tags are per thread), and returns their rows."""
        del description  # Connect has no job descriptions; the tag names the job
        names = [field.strip().split()[0] for field in schema.split(",")]
        arrow_fn = functools.partial(by_value(_arrow_task), fn, names)
        frame = self.session.range(num_tasks, numPartitions=num_tasks)
        self.session.addTag(group)
        try:
            rows = frame.mapInArrow(arrow_fn, schema, barrier=barrier).collect()
        finally:
            try:
                self.session.removeTag(group)
            except Exception:  # the session may be closing
                pass
        return [tuple(row) for row in rows]

    def cancel(self, group: str) -> None:
        """Interrupts every operation tagged ``group`` (its tasks are killed)."""
        self.session.interruptTag(group)


def _arrow_task(fn: TaskFn, names: list[str], batches: Iterable[Any]) -> Iterator[Any]:
    """What a Connect task runs (shipped by value): the partition's ids to ``fn``, its rows
    back as Arrow record batches with columns ``names``."""
    import pyarrow

    def ids() -> Iterator[Any]:
        for batch in batches:
            yield from batch.column(0).to_pylist()

    for row in fn(ids()):
        yield pyarrow.RecordBatch.from_arrays([pyarrow.array([v]) for v in row], names=names)


def _connect_session_type() -> Optional[type]:
    if "pyspark.sql.connect.session" not in sys.modules:
        return None  # nobody made a Connect session (importing it needs grpc)
    return sys.modules["pyspark.sql.connect.session"].SparkSession


def _active_connect_session() -> Any:
    session_type = _connect_session_type()
    if session_type is None:
        return None
    try:
        return session_type.getActiveSession() or session_type._get_default_session()
    except Exception:
        return None


def spark_target(spark: Any = None) -> ClassicSpark | ConnectSpark:
    """The Spark kolo launches on: ``spark`` (a classic or Spark Connect ``SparkSession``, a
    ``SparkContext``, or a target already) when given; else the active ``SparkContext`` (the
    classic path, as before); else the active Spark Connect session. ConfigError when there
    is none.

    Example::

        target = spark_target(SparkSession.builder.remote("sc://host:15002").getOrCreate())
        assert target.is_connect
    """
    if isinstance(spark, (ClassicSpark, ConnectSpark)):
        return spark
    if spark is not None:
        session_type = _connect_session_type()
        if session_type is not None and isinstance(spark, session_type):
            return ConnectSpark(spark)
        sc = getattr(spark, "sparkContext", None) if hasattr(spark, "_jsparkSession") else spark
        if sc is not None and hasattr(sc, "_jsc"):
            return ClassicSpark(sc)
        raise ConfigError(
            f"kolo.spark: spark={type(spark).__name__} is neither a SparkSession (classic or "
            "Spark Connect) nor a SparkContext"
        )
    try:
        from pyspark import SparkContext
    except ImportError as error:
        raise ConfigError(
            "kolo.spark.run needs PySpark: pip install pyspark (3.5 or 4.x)"
        ) from error
    sc = SparkContext._active_spark_context
    if sc is not None:
        return ClassicSpark(sc)
    session = _active_connect_session()
    if session is not None:
        return ConnectSpark(session)
    raise ConfigError(
        "kolo.spark.run needs an active Spark session: create one first, e.g. "
        "SparkSession.builder.getOrCreate(), or SparkSession.builder.remote('sc://...')"
        ".getOrCreate() for Spark Connect"
    )
