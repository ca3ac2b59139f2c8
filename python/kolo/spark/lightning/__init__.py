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

from typing import Any

__all__ = ["TorchEstimator", "TorchModel"]


def __getattr__(name: str) -> Any:
    # Imported on first use, like kolo.spark.torch: the remote trainer imports without PySpark.
    if name == "TorchEstimator":
        from kolo.spark.lightning.estimator import TorchEstimator

        return TorchEstimator
    if name == "TorchModel":
        from kolo.spark.torch.model import TorchModel

        return TorchModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
