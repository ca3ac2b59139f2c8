"""Keras 3 on Spark with kolo: ``KerasEstimator`` (a Spark ML Estimator) trains a Keras model on
a DataFrame over Spark executors and returns a ``KerasModel`` (a Spark ML Transformer), with
Horovod's parameters and module path (``horovod.spark.keras`` → ``kolo.spark.keras``).

Example::

    import keras
    from kolo.spark.keras import KerasEstimator

    keras_model = KerasEstimator(
        num_proc=2, store=store, model=model, optimizer=keras.optimizers.Adam(0.001),
        loss="sparse_categorical_crossentropy", feature_cols=["features"], label_cols=["label"],
    ).fit(df)
    keras_model.transform(test_df).show()
"""

from typing import Any

__all__ = ["KerasEstimator", "KerasModel"]


def __getattr__(name: str) -> Any:
    # Imported on first use: kolo.spark.keras.remote (the training function) imports neither
    # PySpark nor Keras at module level.
    if name == "KerasEstimator":
        from kolo.spark.keras.estimator import KerasEstimator

        return KerasEstimator
    if name == "KerasModel":
        from kolo.spark.keras.model import KerasModel

        return KerasModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
