"""A Keras 3 classifier trained on a Spark DataFrame with ``KerasEstimator``.

scikit-learn's bundled digits (no download) go into a Spark DataFrame, their 64 pixels
assembled into one Vector column with ``VectorAssembler``. ``KerasEstimator(num_proc=2)``
prepares the data as Parquet in a local store, trains on 2 ranks started by
``kolo.spark.run`` (each runs Keras's ``model.fit`` with ``kolo.keras.DistributedOptimizer``,
one progress bar per epoch on the driver), keeps the best epoch by validation loss
(``BestModelCheckpoint``) and returns a ``KerasModel``; its ``transform`` predicts the
held-out quarter in batches with Arrow and the script prints the test accuracy.

Run it (after ``dev/setup.sh``; ``KERAS_BACKEND=torch`` trains with the torch backend)::

    .venv/bin/python examples/spark_keras_estimator.py
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time

import keras
import numpy as np
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import SparkSession
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import kolo.keras as hvd
from kolo.spark.common.store import Store
from kolo.spark.keras import KerasEstimator


def local_spark() -> SparkSession:
    """A local[2] session on 127.0.0.1 whose Python workers use this interpreter."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kolo-spark-keras-estimator")
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


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spark = local_spark()
    train_df, test_df = digits_frames(spark)

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)]
    )
    with tempfile.TemporaryDirectory(prefix="kolo-store-") as store_dir:
        estimator = KerasEstimator(
            num_proc=2,
            store=Store.create(store_dir),
            model=model,
            # lr for one rank; the ranks use lr * 2, as Horovod scales it.
            optimizer=keras.optimizers.SGD(0.025, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            checkpoint_callback=hvd.callbacks.BestModelCheckpoint(monitor="val_loss"),
            backend_env={"KERAS_BACKEND": keras.backend.backend()},
            feature_cols=["features"],
            label_cols=["label"],
            validation=0.1,
            batch_size=32,
            epochs=15,
            random_seed=0,
        )
        started = time.monotonic()
        keras_model = estimator.fit(train_df)
        fit_s = time.monotonic() - started
        history = keras_model.getHistory()
        print(
            f"fit: {fit_s:.1f} s, {len(history['loss'])} epochs, final train loss "
            f"{history['loss'][-1]:.4f}, best validation loss {min(history['val_loss']):.4f}",
            flush=True,
        )

        predictions = keras_model.transform(test_df).select("label", "label__output")
        rows = predictions.collect()
        predicted = np.array([np.argmax(r["label__output"]) for r in rows])
        labels = np.array([r["label"] for r in rows])
        print(f"test accuracy: {(predicted == labels).mean():.4f}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
