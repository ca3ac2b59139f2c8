"""The Spark driver of the multi-host tests: fits the same tiny ``TorchEstimator`` twice, first
on ``local[3]`` (the one-host reference), then on the standalone cluster at ``argv[1]`` (one
1-core worker per host, so each of the 3 ranks runs on another host), and prints
``LOCAL <json>``, ``CLUSTER <json>`` (the fitted weights) and ``EXECUTORS <json>`` (the
executors' hosts).

Every epoch is one full batch per rank (24 rows, 8 per rank, no validation), so the averaged
gradient is the full-data gradient whichever rows Spark hands to which rank: both fits must end
at the same weights.

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


def fit(spark: SparkSession, store_dir: str) -> list:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, 3, generator=g)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.25
    df = spark.createDataFrame([(x[i].tolist(), float(y[i, 0])) for i in range(ROWS)], ["x", "y"])
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    estimator = TorchEstimator(
        num_proc=RANKS,
        store=Store.create(store_dir),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss=torch.nn.functional.mse_loss,
        feature_cols=["x"],
        label_cols=["y"],
        label_shapes=[[-1, 1]],
        batch_size=ROWS // RANKS,
        epochs=5,
        random_seed=1,
        verbose=0,
    )
    fitted = estimator.fit(df).getModel()
    return [p.detach().flatten().tolist() for p in fitted.parameters()]


def main(master: str, host: str, store_dir: str) -> None:
    start = time.monotonic()
    local = session(f"local[{RANKS}]", host)
    local.sparkContext.setLogLevel("ERROR")
    print("LOCAL " + json.dumps(fit(local, os.path.join(store_dir, "local"))), flush=True)
    local.stop()
    print(f"TIMING local {time.monotonic() - start:.1f}s", flush=True)
    cluster = session(master, host)
    cluster.sparkContext.setLogLevel("ERROR")
    print("CLUSTER " + json.dumps(fit(cluster, os.path.join(store_dir, "cluster"))), flush=True)
    # "Map(10.231.0.2:41234 -> (...), ...)": the block managers of the executors and driver.
    status = str(cluster.sparkContext._jsc.sc().getExecutorMemoryStatus())
    hosts = sorted(set(re.findall(r"(\d+\.\d+\.\d+\.\d+):\d+ ->", status)))
    print("EXECUTORS " + json.dumps(hosts), flush=True)
    cluster.stop()
    print(f"TIMING total {time.monotonic() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
