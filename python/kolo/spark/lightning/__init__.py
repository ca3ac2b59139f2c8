"""PyTorch Lightning on Spark with kolo: ``TorchEstimator`` (a Spark ML Estimator) trains a
``LightningModule`` on a DataFrame over Spark executors and returns a ``TorchModel`` (a Spark
ML Transformer), with Horovod's parameters and module path
(``horovod.spark.lightning`` → ``kolo.spark.lightning``).

Example::

    from kolo.spark.lightning import TorchEstimator

    torch_model = TorchEstimator(num_proc=2, store=store, model=lightning_module,
                                 feature_cols=["features"], label_cols=["label"]).fit(df)
    torch_model.transform(test_df).show()
"""

from kolo.spark._lazy import lazy_names

__all__ = ["TorchEstimator", "TorchModel"]

__getattr__ = lazy_names(
    __name__,
    {"TorchEstimator": "kolo.spark.lightning.estimator", "TorchModel": "kolo.spark.torch.model"},
)
