"""A Spark Connect client that fits and transforms with kolo's Spark estimators.

Run as ``python spark_connect_estimator_worker.py sc://127.0.0.1:PORT STORE_DIR SCENARIO[,...]``:
the client holds only a Spark Connect session (``SparkSession.builder.remote``, no
``SparkContext`` in this process), so nothing here can fall back to the classic API. It runs
the scenarios in order in one session (each in a store folder of its own) and prints one line
``RESULT <json>``, ``{scenario: result}``, for the test to check (a scenario that raised gives
``{"error": "<traceback>"}``). Keras loads TensorFlow: run it in a process of its own.

The client is a process of its own because PySpark switches a whole process to Connect mode
(``pyspark.sql.functions`` then build Connect columns), which the suite's classic ``spark``
session cannot share.

Scenarios:
- ``transform``: a ``TorchModel`` trained here (no Spark) transforms the test digits on the
  server; ``max_diff`` is the largest difference from the same model run locally.
- ``bad_input``: fits that must fail at the call site with typed errors (missing column,
  string feature column, empty DataFrame, unwritable store); ``errors`` maps each case to
  ``[exception class, message]``.
- ``torch``: ``TorchEstimator`` fit (4 epochs, validation 0.2) → transform; ``accuracy`` on the
  test digits, ``history``, ``fit_s``.
- ``keras``: one small ``KerasEstimator`` fit (1 epoch) → transform; ``rows``, ``history``.
- ``lightning``: one small Lightning ``TorchEstimator`` fit (1 epoch, ``num_proc`` left to the
  server's default parallelism) → transform; ``rows``, ``history``, ``num_proc``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for support.digits

import numpy as np

SCENARIOS = ("transform", "bad_input", "keras", "lightning")


def session(url: str):
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    return spark


def digits(spark, vectors: bool = True):
    from support.digits import digits_frames

    return digits_frames(spark, vectors=vectors)


def accuracy_of(predictions) -> float:
    from support.digits import digit_accuracy

    return digit_accuracy(predictions)


def torch_classifier():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def torch_estimator(store=None, **overrides):
    import torch

    from kolo.spark.torch import TorchEstimator

    def accuracy(output, label):
        return (output.argmax(dim=1) == label).float().mean()

    model = torch_classifier()
    params = dict(
        num_proc=2,
        store=store,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        loss=torch.nn.functional.cross_entropy,
        metrics=[accuracy],
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.2,
        batch_size=32,
        epochs=4,
        random_seed=1,
        verbose=0,
    )
    params.update(overrides)
    return TorchEstimator(**params)


def scenario_transform(spark, store) -> dict:
    import torch
    from sklearn.datasets import load_digits

    from kolo.spark.torch import TorchModel

    _, test_df = digits(spark)
    model = torch_classifier()
    # a few local steps (no Spark) so that the model is worth predicting with
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(30):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    fitted = TorchModel(
        model=model,
        feature_columns=["features"],
        label_columns=["label"],
        metadata={"columns": {"features": {"dtype": "float32", "shape": [64]}}},
    )
    predictions = fitted.transform(test_df).select("features", "label", "label__output")
    got = predictions.collect()
    local_in = torch.tensor(np.array([r["features"].toArray() for r in got]), dtype=torch.float32)
    with torch.no_grad():
        expected = model(local_in).double().numpy()
    served = np.array([r["label__output"] for r in got])
    # A model larger than the server takes in one message (the fixture's server: 32 MiB).
    big = TorchModel(
        model=torch.nn.Linear(64, 160_000),
        feature_columns=["features"],
        label_columns=["label"],
        metadata={"columns": {"features": {"dtype": "float32", "shape": [64]}}},
    )
    try:
        big.transform(test_df)
        too_big = ["no error", ""]
    except Exception as error:
        too_big = [type(error).__name__, str(error)]
    return {
        "rows": len(got),
        "columns": predictions.columns,
        "max_diff": float(np.abs(served - expected).max()),
        "accuracy": accuracy_of(predictions),
        "too_big": too_big,
    }


def scenario_bad_input(spark, store) -> dict:
    from kolo.store import Store

    small = spark.createDataFrame(
        [([float(i), 1.0], float(i), f"n{i}") for i in range(40)], ["x", "y", "name"]
    )
    Path(store.prefix_path).mkdir(parents=True, exist_ok=True)
    blocker = Path(store.prefix_path) / "a_file"
    blocker.write_text("not a directory")
    cases = {
        "missing_column": dict(feature_cols=["nope"], label_cols=["y"]),
        "string_feature": dict(feature_cols=["x", "name"], label_cols=["y"]),
        "empty": dict(feature_cols=["x"], label_cols=["y"], _filter="y > 100"),
        "store_not_writable": dict(
            feature_cols=["x"], label_cols=["y"], store=Store.create(str(blocker / "store"))
        ),
    }
    errors = {}
    for name, overrides in cases.items():
        df = small.filter(overrides.pop("_filter")) if "_filter" in overrides else small
        import torch

        model = torch.nn.Linear(2, 1)
        params = dict(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            loss=torch.nn.functional.mse_loss,
            validation=None,
        )
        params.update(overrides)
        params.setdefault("store", store)
        try:
            torch_estimator(**params).fit(df)
        except Exception as error:  # the class and message are what the test checks
            errors[name] = [type(error).__module__ + "." + type(error).__name__, str(error)]
        else:
            errors[name] = ["no error", ""]
    return {"errors": errors}


def scenario_keras(spark, store) -> dict:
    import kolo.keras  # noqa: F401 - before Keras (docs/keras.md)

    # isort: split
    import keras

    from kolo.spark.keras import KerasEstimator

    train_df, test_df = digits(spark)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
    )
    est = KerasEstimator(
        num_proc=2,
        store=store,
        model=model,
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        feature_cols=["features"],
        label_cols=["label"],
        batch_size=32,
        epochs=1,
        random_seed=0,
        verbose=0,
    )
    fitted = est.fit(train_df)
    predictions = fitted.transform(test_df)
    return {
        "history": {k: [float(v) for v in vs] for k, vs in fitted.getHistory().items()},
        "rows": predictions.count(),
        "columns": predictions.columns,
    }


def scenario_lightning(spark, store) -> dict:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F

    from kolo.spark.lightning import TorchEstimator

    class DigitsNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
            self.out = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.out(self.net(x))

        def training_step(self, batch, batch_idx):
            loss = F.cross_entropy(self(batch["features"]), batch["label"])
            self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    train_df, test_df = digits(spark, vectors=False)
    est = TorchEstimator(  # num_proc: the server's default parallelism (2)
        store=store,
        model=DigitsNet(),
        feature_cols=["features"],
        label_cols=["label"],
        batch_size=32,
        epochs=1,
        random_seed=1,
        verbose=0,
    )
    fitted = est.fit(train_df)
    predictions = fitted.transform(test_df)
    return {
        "history": {k: [float(v) for v in vs] for k, vs in fitted.getHistory().items()},
        "rows": predictions.count(),
        "columns": predictions.columns,
        "num_proc": est._num_proc(),
    }


def main() -> None:
    import traceback

    url, store_dir, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kolo.store import Store

    spark = session(url)
    results = {}
    try:
        for name in names:
            store = Store.create(str(Path(store_dir) / name))
            try:
                results[name] = globals()[f"scenario_{name}"](spark, store)
            except Exception:
                results[name] = {"error": traceback.format_exc()}
    finally:
        spark.stop()
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
