"""The Spark driver of the multi-host tests: fits a tiny ``TorchEstimator`` on the standalone
cluster at ``argv[1]`` (one 1-core worker per host, so each of the 3 ranks runs on another host)
and prints ``REFERENCE <json>`` (the weights one process reaches by plain full-batch gradient
descent), ``CLUSTER <json>`` (the fitted weights) and ``EXECUTORS <json>`` (the executors' hosts).

Every epoch is one full batch per rank (24 rows, 8 per rank, no validation), so the averaged
gradient is the full-data gradient whichever rows Spark hands to which rank, and the ranks'
learning rate is ``lr * size`` (Horovod's scaling): the fit must end at the weights of
``epochs`` full-batch steps at that rate, taken in this process.

    python multihost_spark_driver.py spark://10.231.0.1:7077 10.231.0.1 STORE_DIR
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import torch
from pyspark.sql import SparkSession

from kolo.spark.torch import TorchEstimator
from kolo.store import Store

ROWS = 24
RANKS = 3


def session(master: str, host: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return (
        SparkSession.builder.master(master)
        .appName("kolo-multihost")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", host)
        .config("spark.driver.bindAddress", host)
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(RANKS))
        .config("spark.default.parallelism", str(RANKS))
        .config("spark.sql.shuffle.partitions", str(RANKS))
        .config("spark.pyspark.python", sys.executable)
        .getOrCreate()
    )


LR, EPOCHS = 0.1, 5


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, 3, generator=g)
    return x, x @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.25


def initial_model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def weights(model: torch.nn.Module) -> list:
    return [p.detach().flatten().tolist() for p in model.parameters()]


def reference() -> list:
    """``EPOCHS`` full-batch SGD steps at ``LR * RANKS`` in this process."""
    x, y = data()
    model = initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * RANKS)
    for _ in range(EPOCHS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return weights(model)


def fit(spark: SparkSession, store_dir: str) -> list:
    x, y = data()
    df = spark.createDataFrame([(x[i].tolist(), float(y[i, 0])) for i in range(ROWS)], ["x", "y"])
    model = initial_model()
    estimator = TorchEstimator(
        num_proc=RANKS,
        store=Store.create(store_dir),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        loss=torch.nn.functional.mse_loss,
        feature_cols=["x"],
        label_cols=["y"],
        label_shapes=[[-1, 1]],
        batch_size=ROWS // RANKS,
        epochs=EPOCHS,
        random_seed=1,
        verbose=0,
    )
    return weights(estimator.fit(df).getModel())


def main(master: str, host: str, store_dir: str) -> None:
    start = time.monotonic()
    print("REFERENCE " + json.dumps(reference()), flush=True)
    cluster = session(master, host)
    cluster.sparkContext.setLogLevel("ERROR")
    print("CLUSTER " + json.dumps(fit(cluster, store_dir)), flush=True)
    # "Map(10.231.0.2:41234 -> (...), ...)": the block managers of the executors and driver.
    status = str(cluster.sparkContext._jsc.sc().getExecutorMemoryStatus())
    hosts = sorted(set(re.findall(r"(\d+\.\d+\.\d+\.\d+):\d+ ->", status)))
    print("EXECUTORS " + json.dumps(hosts), flush=True)
    cluster.stop()
    print(f"TIMING total {time.monotonic() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
