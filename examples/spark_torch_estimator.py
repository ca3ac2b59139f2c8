"""kolo's main job: a PyTorch classifier trained on a Spark DataFrame with ``TorchEstimator``.

scikit-learn's bundled digits (no download) go into a Spark DataFrame, their 64 pixels
assembled into one Vector column with ``VectorAssembler``. ``TorchEstimator(num_proc=2)``
prepares the data as Parquet in a local store, trains on 2 ranks started by
``kolo.spark.run`` on a barrier stage (gradients averaged by kolo's engine, one progress bar
per epoch), and returns a ``TorchModel``; its ``transform`` predicts the held-out quarter in
batches with Arrow and the script prints the test accuracy.

Run it (after ``dev/setup.sh``)::

    .venv/bin/python examples/spark_torch_estimator.py

With ``--connect URL`` the same job runs from a Spark Connect client
(``SparkSession.builder.remote(URL)``: no ``SparkContext`` in this process, as on Databricks
shared and serverless clusters); ``--connect`` without a URL first starts a local Spark Connect
server (PySpark's ``SparkConnectServer``, ``local[2]``, bound to 127.0.0.1) and stops it at the
end::

    .venv/bin/python examples/spark_torch_estimator.py --connect
    .venv/bin/python examples/spark_torch_estimator.py --connect sc://127.0.0.1:15002
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator, Optional

import numpy as np
import torch
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from kolo.spark.common.store import Store
from kolo.spark.torch import TorchEstimator


def local_spark() -> SparkSession:
    """A local[2] session on 127.0.0.1 whose Python workers use this interpreter."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kolo-spark-torch-estimator")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def local_connect_server(timeout_s: float = 180.0) -> Iterator[str]:
    """A Spark Connect server from the pyspark package (``local[2]``, gRPC and driver bound to
    127.0.0.1, executors running this interpreter) for the duration; yields its ``sc://``
    URL and stops it (its whole process group) at the end."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    port = _free_port()
    confs = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.pyspark.python": sys.executable,
    }
    command = [os.path.join(spark_home, "bin", "spark-submit"), "--master", "local[2]"]
    command += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    command.append("spark-internal")
    env = dict(os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1")
    env["PYSPARK_PYTHON"] = sys.executable
    log = tempfile.NamedTemporaryFile(prefix="kolo-connect-server-", suffix=".log", delete=False)
    server = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start; see {log.name}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


def connect_spark(url: str) -> SparkSession:
    """A Spark Connect client session on ``url`` (no SparkContext in this process)."""
    return SparkSession.builder.remote(url).getOrCreate()


def digits_frames(spark: SparkSession):
    """(train, test) DataFrames with a Vector ``features`` column and an int ``label``."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0,
        digits.target,
        test_size=0.25,
        random_state=0,
        stratify=digits.target,
    )
    names = [f"pixel{i}" for i in range(64)]
    assembler = VectorAssembler(inputCols=names, outputCol="features")

    def frame(x: np.ndarray, y: np.ndarray):
        rows = [(*map(float, xi), int(yi)) for xi, yi in zip(x, y)]
        return assembler.transform(spark.createDataFrame(rows, [*names, "label"])).select(
            "features", "label"
        )

    return frame(x_train, y_train), frame(x_test, y_test)


def accuracy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output.argmax(dim=1) == label).float().mean()


def train_and_test(spark: SparkSession) -> None:
    """Fit on the training digits, transform the test digits, print the accuracy."""
    train_df, test_df = digits_frames(spark)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with tempfile.TemporaryDirectory(prefix="kolo-store-") as store_dir:
        estimator = TorchEstimator(
            num_proc=2,
            store=Store.create(store_dir),
            model=model,
            # lr for one rank; the ranks use lr * 2, as Horovod scales it.
            optimizer=torch.optim.SGD(model.parameters(), lr=0.025, momentum=0.9),
            loss=torch.nn.functional.cross_entropy,
            metrics=[accuracy],
            feature_cols=["features"],
            label_cols=["label"],
            validation=0.1,
            batch_size=32,
            epochs=15,
            random_seed=0,
        )
        started = time.monotonic()
        torch_model = estimator.fit(train_df)
        fit_s = time.monotonic() - started
        history = torch_model.getHistory()
        print(
            f"fit: {fit_s:.1f} s, {len(history['train_loss'])} epochs, final train loss "
            f"{history['train_loss'][-1]:.4f}, validation accuracy "
            f"{history['val_accuracy'][-1]:.4f}",
            flush=True,
        )

        predictions = torch_model.transform(test_df).select("label", "label__output")
        rows = predictions.collect()
        predicted = np.array([np.argmax(r["label__output"]) for r in rows])
        labels = np.array([r["label"] for r in rows])
        print(f"test accuracy: {(predicted == labels).mean():.4f}", flush=True)


def main(argv: Optional[list] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--connect",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="run through Spark Connect: the server's sc:// URL, or none to start a local "
        "server on 127.0.0.1 for this run",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.connect is None:
        spark = local_spark()
        train_and_test(spark)
        spark.stop()
        return
    with contextlib.ExitStack() as stack:
        url = args.connect or stack.enter_context(local_connect_server())
        print(f"Spark Connect: {url}", flush=True)
        spark = connect_spark(url)
        stack.callback(spark.stop)
        train_and_test(spark)


if __name__ == "__main__":
    main()
