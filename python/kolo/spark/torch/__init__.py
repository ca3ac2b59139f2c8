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

from kolo.spark._lazy import lazy_names

__all__ = ["TorchEstimator", "TorchModel"]

__getattr__ = lazy_names(
    __name__,
    {"TorchEstimator": "kolo.spark.torch.estimator", "TorchModel": "kolo.spark.torch.model"},
)
