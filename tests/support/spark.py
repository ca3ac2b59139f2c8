"""A local PySpark session for the Spark suites, bound to 127.0.0.1 and using this venv's Python.

Example::

    from support.spark import spark  # a pytest fixture, imported by conftest.py

    def test_count(spark):
        assert spark.range(3).count() == 3
"""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest
from support.emulators import free_port


def local_session_builder(master: str = "local[2]"):
    """A ``SparkSession.Builder`` for tests: loopback only, no UI, small shuffles."""
    pyspark_sql = pytest.importorskip("pyspark.sql")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return (
        pyspark_sql.SparkSession.builder.master(master)
        .appName("kolo-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.pyspark.python", sys.executable)
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One ``local[2]`` SparkSession for the whole test session."""
    session = local_session_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _wait_for_port(port: int, timeout: float) -> bool:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


#: The simulated hostnames of the standalone cluster's two workers (``KOLO_HOSTNAME`` in each
#: Worker's environment, inherited by its executors and their Python workers).
STANDALONE_HOSTS = ("kolo-host-a", "kolo-host-b")


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory) -> Iterator[str]:
    """A Spark standalone cluster from the pyspark package: one Master and two Workers (2 cores,
    1 GiB each) on 127.0.0.1 with random free ports, the Workers simulating two hosts through
    ``KOLO_HOSTNAME`` (see :data:`STANDALONE_HOSTS`). Yields the master URL; tears everything
    down (process groups) at the end.

    Example::

        def test_cluster(standalone_cluster):
            session = local_session_builder(standalone_cluster).getOrCreate()
    """
    import signal
    import subprocess
    import time

    pyspark = pytest.importorskip("pyspark")
    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    root = tmp_path_factory.mktemp("spark-standalone")
    base_env = dict(
        os.environ,
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(root / "logs"),
        PYSPARK_PYTHON=sys.executable,
    )
    processes: list[subprocess.Popen] = []

    def start(name: str, args: list[str], env: dict[str, str]) -> None:
        log = open(root / f"{name}.log", "wb")
        processes.append(
            subprocess.Popen(
                [spark_class, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    port = free_port()
    master = f"spark://127.0.0.1:{port}"
    try:
        start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(free_port()),
            ],
            base_env,
        )
        if not _wait_for_port(port, 60):
            pytest.fail(f"the Spark master did not start; see {root / 'master.log'}")
        for index, host in enumerate(STANDALONE_HOSTS):
            work_dir = root / f"work-{index}"
            work_dir.mkdir()
            start(
                f"worker-{index}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    "2",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work_dir),
                    master,
                ],
                dict(base_env, KOLO_HOSTNAME=host),
            )
        yield master
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)


def stop_process_group(process, grace_s: float = 15.0) -> None:
    """SIGTERM to ``process``'s process group, then SIGKILL after ``grace_s``; waits for it."""
    import signal
    import subprocess

    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


#: The class PySpark's ``sbin/start-connect-server.sh`` submits (the jar ships in pyspark/jars).
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def start_connect_server(log_dir, master: str = "local[2]"):
    """Starts a Spark Connect server from the pyspark package (``master``, its gRPC endpoint
    and its driver on 127.0.0.1, a free port, no UI, executors running this venv's Python) in
    a process group of its own, logging to ``log_dir/connect-server.log``; waits (up to 120 s)
    until it listens. Returns ``(url, process)``; stop it with :func:`stop_process_group`.
    Benchmarks use it as well as the :func:`connect_server` fixture.

    Example::

        url, server = start_connect_server(Path("/tmp/logs"))
        try:
            spark = ConnectSession.builder.remote(url).getOrCreate()
        finally:
            stop_process_group(server)
    """
    import subprocess
    from pathlib import Path

    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    confs = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.pyspark.python": sys.executable,
        # 32 MiB (the default is 128): a test sends a model over the limit without building one
        # of 128 MiB.
        "spark.connect.grpc.maxInboundMessageSize": str(32 << 20),
    }
    command = [os.path.join(spark_home, "bin", "spark-submit"), "--master", master]
    command += ["--name", "kolo-tests-connect", "--class", CONNECT_SERVER_CLASS]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    command.append("spark-internal")
    env = dict(
        os.environ,
        SPARK_HOME=spark_home,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(log_dir),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        env.pop(name, None)
    log_path = log_dir / "connect-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    if not _wait_for_port(port, 120):
        stop_process_group(process)
        raise RuntimeError(f"the Spark Connect server did not start; see {log_path}")
    return f"sc://127.0.0.1:{port}", process


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory) -> Iterator[str]:
    """A Spark Connect server (:func:`start_connect_server`: ``local[2]`` on 127.0.0.1) for the
    whole test session. Yields its ``sc://127.0.0.1:PORT`` URL; stops the server at the end.

    Example::

        def test_remote(connect_server):
            spark = ConnectSession.builder.remote(connect_server).getOrCreate()
    """
    pytest.importorskip("pyspark")
    pytest.importorskip("grpc")  # the Connect client's transport (pyspark[connect])
    try:
        url, process = start_connect_server(tmp_path_factory.mktemp("spark-connect"))
    except RuntimeError as error:
        pytest.fail(str(error))
    try:
        yield url
    finally:
        stop_process_group(process)


@pytest.fixture(scope="session")
def connect_spark(connect_server) -> Iterator[object]:
    """A Spark Connect client session on :func:`connect_server`, shared by the whole test
    session. It is made with the Connect builder itself
    (``pyspark.sql.connect.session.SparkSession.builder.remote(url)``, what
    ``SparkSession.builder.remote(url)`` returns in a process without a ``SparkContext``),
    so it can live next to the classic :func:`spark` fixture in one process, and it leaves
    ``SPARK_CONNECT_MODE_ENABLED`` unset (that variable would switch every later
    ``pyspark.sql.functions`` call of the classic suites to Connect). Code that builds
    columns for it uses ``pyspark.sql.connect.functions``.

    Example::

        def test_count(connect_spark):
            assert connect_spark.range(3).count() == 3
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server).getOrCreate()
    yield session
    session.stop()
