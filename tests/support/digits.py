"""scikit-learn's digits as Spark DataFrames, and the accuracy of a transform's predictions:
the shared data of the Spark estimator suites (PyTorch, Keras, Lightning)."""

from __future__ import annotations

import numpy as np


def digits_frames(spark, vectors: bool = True):
    """(train, test) DataFrames of the digits (every fifth row is test) with an int ``label``
    and a ``features`` column: a Spark ML Vector (dense and sparse rows, as VectorAssembler
    makes them) with ``vectors``, else ``array<double>``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    if not vectors:
        rows = [
            ([float(v) for v in x / 16.0], int(y), i % 5 == 0)
            for i, (x, y) in enumerate(zip(digits.data, digits.target))
        ]
        df = spark.createDataFrame(rows, ["features", "label", "is_test"])
    else:
        from pyspark.ml.feature import VectorAssembler

        rows = [
            (*map(float, x / 16.0), int(y), i % 5 == 0)
            for i, (x, y) in enumerate(zip(digits.data, digits.target))
        ]
        names = [f"p{i}" for i in range(64)]
        df = spark.createDataFrame(rows, [*names, "label", "is_test"])
        df = VectorAssembler(inputCols=names, outputCol="features").transform(df)
        df = df.select("features", "label", "is_test")
    return df.filter(~df.is_test).drop("is_test"), df.filter(df.is_test).drop("is_test")


def digit_accuracy(predictions) -> float:
    """The share of rows whose ``label__output`` argmax is the ``label``."""
    rows = predictions.select("label", "label__output").collect()
    outputs = np.array([r["label__output"] for r in rows])
    labels = np.array([r["label"] for r in rows])
    return float((outputs.argmax(axis=1) == labels).mean())
