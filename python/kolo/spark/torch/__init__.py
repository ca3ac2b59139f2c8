"""PyTorch on Spark with kolo: ``TorchEstimator`` (a Spark ML Estimator) trains a model on a
DataFrame over Spark executors and returns a ``TorchModel`` (a Spark ML Transformer), with
Horovod's parameters and module path (``horovod.spark.torch`` → ``kolo.spark.torch``).

Example::

    from kolo.spark.torch import TorchEstimator

    torch_model = TorchEstimator(num_proc=2, store=store, model=model, optimizer=opt,
                                 loss=loss, feature_cols=["features"],
                                 label_cols=["label"]).fit(df)
    torch_model.transform(test_df).show()
"""

from typing import Any

__all__ = ["TorchEstimator", "TorchModel"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that kolo.spark.torch.remote (the training loop, shared with
    # kolo.ray.TorchEstimator) is importable without PySpark.
    if name == "TorchEstimator":
        from kolo.spark.torch.estimator import TorchEstimator

        return TorchEstimator
    if name == "TorchModel":
        from kolo.spark.torch.model import TorchModel

        return TorchModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
