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

from kolo.spark._lazy import lazy_names

__all__ = ["KerasEstimator", "KerasModel"]

__getattr__ = lazy_names(
    __name__,
    {"KerasEstimator": "kolo.spark.keras.estimator", "KerasModel": "kolo.spark.keras.model"},
)
