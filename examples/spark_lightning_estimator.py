"""A PyTorch Lightning classifier trained on a Spark DataFrame with kolo's Lightning
``TorchEstimator`` (Horovod's ``horovod.spark.lightning.TorchEstimator``).

scikit-learn's bundled digits (no download) go into a Spark DataFrame, their 64 pixels in one
``array<double>`` column. ``TorchEstimator(num_proc=2)`` prepares the data as Parquet in a local
store and runs ``lightning.pytorch.Trainer(strategy=KoloStrategy())`` on 2 ranks started by
``kolo.spark.run``: ``training_step`` gets each batch as a dict of column tensors, what the
module logs with ``sync_dist=True`` becomes the history, and rank 0 checkpoints each epoch into
the store. The returned ``TorchModel`` predicts the held-out quarter with ``transform``; the
script prints the test accuracy.

Run it (after ``dev/setup.sh``)::

    .venv/bin/python examples/spark_lightning_estimator.py
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from kolo.spark.common.store import Store
from kolo.spark.lightning import TorchEstimator


class DigitsClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch["features"]), batch["label"])
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self(batch["features"])
        self.log("val_loss", F.cross_entropy(logits, batch["label"]), sync_dist=True)
        accuracy = (logits.argmax(dim=1) == batch["label"]).float().mean()
        self.log("val_accuracy", accuracy, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def local_spark() -> SparkSession:
    """A local[2] session on 127.0.0.1 whose Python workers use this interpreter."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kolo-spark-lightning-estimator")
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


def digits_frames(spark: SparkSession):
    """(train, test) DataFrames with an ``array<double>`` ``features`` column and an int
    ``label``."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )

    def frame(x: np.ndarray, y: np.ndarray):
        rows = [([float(v) for v in xi], int(yi)) for xi, yi in zip(x, y)]
        return spark.createDataFrame(rows, ["features", "label"])

    return frame(x_train, y_train), frame(x_test, y_test)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spark = local_spark()
    train_df, test_df = digits_frames(spark)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="kolo-store-") as store_dir:
        estimator = TorchEstimator(
            num_proc=2,
            store=Store.create(store_dir),
            model=DigitsClassifier(),
            feature_cols=["features"],
            label_cols=["label"],
            validation=0.1,
            batch_size=32,
            epochs=12,
            random_seed=0,
            run_id="digits",
            trainer_args={"gradient_clip_val": 5.0},
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
        rows = torch_model.transform(test_df).select("label", "label__output").collect()
        predicted = np.array([np.argmax(r["label__output"]) for r in rows])
        labels = np.array([r["label"] for r in rows])
        print(f"test accuracy: {(predicted == labels).mean():.4f}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
