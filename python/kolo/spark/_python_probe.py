"""Checks, before a launch, that the Spark executors' Python can import kolo.

Without this check a session whose executors run another Python (``PYSPARK_PYTHON`` or
``spark.pyspark.python`` pointing at one without kolo, e.g. the venv's python used without the
venv activated on the executors) fails deep in the barrier stage with a Py4J stack whose cause,
``No module named 'kolo'``, is only in the executor log. :func:`check_executor_python` runs one
tiny job whose function is pickled by value (so it runs without kolo), asks each task's Python
for its path, version and ``import kolo``, and raises :class:`~kolo.exceptions.ConfigError`
at the driver naming that Python and how to point the executors at one with kolo. A success is
remembered per Spark application and executor Python, so later launches pay nothing.

It runs on a classic ``SparkContext`` and on a Spark Connect session alike (there the job is a
``mapInArrow`` of ``spark.range``; see :mod:`kolo.spark._session`).

Example::

    check_executor_python(spark.sparkContext, num_tasks=2, timeout_s=60)
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from typing import Any, Iterable, Iterator, Optional

from kolo.exceptions import ConfigError, LaunchError
from kolo.spark._session import by_value, spark_target

log = logging.getLogger("kolo.spark")

#: Seconds the probe job may take before the launch goes on without its answer.
PROBE_TIMEOUT_S = 60.0
#: The probe task's row (the Connect path's ``mapInArrow`` schema).
PROBE_ROW_SCHEMA = "found boolean, python string, version string, detail string, host string"

_checked: set[tuple[str, str]] = set()
_checked_lock = threading.Lock()


def _probe(partition: Iterable[Any]) -> Iterator[tuple]:
    """Runs in the executor's Python: reports it and whether it imports kolo."""
    import os
    import socket
    import sys

    for _ in partition:
        pass
    try:
        import cloudpickle  # noqa: F401 - a rank unpickles its function with it

        import kolo
        import kolo._native

        found, detail = True, os.path.dirname(kolo.__file__)
    except Exception as error:  # any import failure is the answer
        found, detail = False, f"{type(error).__name__}: {error}"
    version = ".".join(str(part) for part in sys.version_info[:3])
    yield (found, sys.executable, version, detail, socket.gethostname())


def _executor_python(sc: Any) -> str:
    return spark_target(sc).executor_python()


def check_executor_python(sc: Any, num_tasks: int, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raises :class:`~kolo.exceptions.ConfigError` when the executors' Python cannot import
    kolo (their Python's path and version as the executors report them, and the fix); a
    probe that does not finish within ``timeout_s`` (executors still coming) lets the launch
    go on.

    ``sc`` is a ``SparkContext``, a classic or Spark Connect ``SparkSession``, or a target of
    :func:`kolo.spark._session.spark_target`.

    Example::

        check_executor_python(sc, num_tasks=2)
    """
    sc = spark_target(sc)
    key = (sc.app_id(), sc.executor_python())
    with _checked_lock:
        if key in _checked:
            return
    answers = _run_probe(sc, max(1, num_tasks), timeout_s)
    if answers is None:
        return
    missing = [answer for answer in answers if not answer[0]]
    if missing:
        raise ConfigError(_missing_kolo_message(sc, missing))
    with _checked_lock:
        _checked.add(key)


def executor_python_checked(sc: Any) -> bool:
    """Whether the executors' Python of ``sc`` is known to import kolo (a probe or a launch
    passed on this Spark application and executor Python).

    Example::

        if not executor_python_checked(target): ...
    """
    sc = spark_target(sc)
    with _checked_lock:
        return (sc.app_id(), sc.executor_python()) in _checked


def remember_executor_python(sc: Any) -> None:
    """Records that the executors' Python of ``sc`` imports kolo (a launch's tasks ran kolo
    there), so later launches skip the probe.

    Example::

        remember_executor_python(target)
    """
    sc = spark_target(sc)
    with _checked_lock:
        _checked.add((sc.app_id(), sc.executor_python()))


def diagnose_executor_python(sc: Any, num_tasks: int, timeout_s: float) -> Optional[ConfigError]:
    """After a launch that did not check the executors' Python first failed: the
    :class:`~kolo.exceptions.ConfigError` :func:`check_executor_python` gives when that Python
    cannot run kolo (the failure's real cause), else None (the launch's own error stands).

    Example::

        diagnosis = diagnose_executor_python(target, 2, 60)
        if diagnosis is not None:
            raise diagnosis from launch_error
    """
    try:
        check_executor_python(sc, num_tasks, timeout_s)
    except ConfigError as error:
        return error
    except Exception as error:  # the probe itself failed otherwise: keep the launch's error
        log.debug("kolo.spark.run: checking the executors' Python after a failure: %s", error)
    return None


def _run_probe(sc: Any, num_tasks: int, timeout_s: float) -> Optional[list[tuple]]:
    group = f"kolo.spark.python-probe-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}
    done = threading.Event()
    probe = by_value(_probe)

    def job() -> None:
        try:
            outcome["answers"] = sc.run_tasks(
                probe,
                num_tasks,
                group,
                "kolo: check the executors' Python",
                PROBE_ROW_SCHEMA,
                barrier=False,
            )
        except BaseException as error:
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=job, name="kolo-spark-python-probe", daemon=True).start()
    try:
        finished = done.wait(timeout_s)
    except BaseException:  # Ctrl-C: leave no probe job behind
        sc.cancel(group)
        raise
    if not finished:
        sc.cancel(group)
        log.info(
            "kolo.spark.run: the executors' Python check did not finish in %.0fs; going on",
            timeout_s,
        )
        return None
    if "error" in outcome:
        raise _probe_failed(sc, outcome["error"]) from outcome["error"]
    return outcome["answers"]


def _fix() -> str:
    return (
        "Point the executors at a Python that has kolo (this driver's is "
        f"{sys.executable}): set PYSPARK_PYTHON=<that python> before the session starts, or "
        'SparkSession.builder.config("spark.pyspark.python", "<that python>") (on YARN/k8s '
        "also spark.executorEnv.PYSPARK_PYTHON), or install kolo into the executors' Python, "
        "or add kolo's directory to spark.executorEnv.PYTHONPATH"
    )


def _missing_kolo_message(sc: Any, missing: list[tuple]) -> str:
    detail = missing[0][3]
    pythons = sorted({f"{answer[1]} (Python {answer[2]}) on {answer[4]}" for answer in missing})
    return (
        f"kolo.spark.run: the Spark executors' Python cannot import kolo ({detail}). The "
        f"executors run {', '.join(pythons)} (the session's Python for executors is "
        f"{_executor_python(sc)!r}, from spark.pyspark.python or PYSPARK_PYTHON). {_fix()}."
    )


#: What a Spark error says when the executors' Python itself is wrong (missing, wrong version).
_PYTHON_CAUSES = ("Cannot run program", "PYTHON_VERSION_MISMATCH", "different minor versions")


def _probe_failed(sc: Any, error: BaseException) -> Exception:
    """The typed error for a probe job that failed: :class:`ConfigError` when Spark says the
    executors' Python cannot run, :class:`LaunchError` for anything else."""
    text = str(error)
    python_cause = next((c for c in _PYTHON_CAUSES if c in text), None)
    if python_cause is not None:
        cause = text[text.index(python_cause) :].splitlines()[0].strip()
        kind: type = ConfigError
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        cause = lines[0] if lines else type(error).__name__
        kind = LaunchError
    return kind(
        "kolo.spark.run: a Python task could not run on the Spark executors (their Python is "
        f"{_executor_python(sc)!r}, from spark.pyspark.python or PYSPARK_PYTHON): {cause}. "
        f"{_fix()}."
    )
