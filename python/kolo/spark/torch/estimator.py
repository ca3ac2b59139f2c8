"""``TorchEstimator``: a Spark ML Estimator that trains a PyTorch model with kolo on Spark
executors and returns a :class:`~kolo.spark.torch.TorchModel` (Horovod's
``horovod.spark.torch.TorchEstimator``).

Example::

    import torch
    from kolo.spark.common.store import Store
    from kolo.spark.torch import TorchEstimator

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    est = TorchEstimator(
        num_proc=2,
        store=Store.create("/tmp/kolo-store"),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        loss=torch.nn.functional.cross_entropy,
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.1,
        batch_size=32,
        epochs=10,
    )
    torch_model = est.fit(train_df)
    predictions = torch_model.transform(test_df)   # adds label__output
"""

from __future__ import annotations

from typing import Any, Dict

from kolo.estimator.dataset import PreparedDataset
from kolo.estimator.torch_spec import (
    RemoteLossConstructor,
    build_torch_spec,
    check_model_and_loss,
    trained_model,
    trained_optimizer,
)
from kolo.estimator.torch_trainer import TorchTrainer
from kolo.spark.common.estimator import KoloEstimator
from kolo.spark.common.params import TorchEstimatorParams, torch_estimator_defaults
from kolo.spark.torch.model import TorchModel

__all__ = ["RemoteLossConstructor", "TorchEstimator", "check_horovod_constructor", "torch_model"]


class TorchEstimator(KoloEstimator, TorchEstimatorParams):
    """Trains a PyTorch model on a Spark DataFrame with kolo (Horovod's parameters).

    Keyword arguments are the parameters (each also has ``getX``/``setX``):

    - ``num_proc``: ranks (default: Spark's default parallelism); ``store``: a
      :class:`kolo.store.Store` for the prepared data, checkpoints and logs.
    - ``model`` (a ``torch.nn.Module``), ``optimizer`` (built on ``model.parameters()``; each
      rank builds the same class with the same param-group hyper-parameters on its copy, the
      learning rate multiplied by the number of ranks, as Horovod does), ``loss`` (a callable
      ``loss(output, label)`` or one per label column; with ``sample_weight_col`` it is called
      with ``reduction="none"``, or a ``torch.nn`` loss module is used unreduced),
      ``loss_weights``, ``loss_constructors`` (functions returning losses, for losses that
      cannot be pickled), ``metrics`` (``metric(output, label) -> number``, averaged over
      ranks), ``callbacks`` (objects with any of ``on_epoch_begin(epoch, logs)``,
      ``on_train_batch_end(step, logs)``, ``on_epoch_end(epoch, logs)``).
    - ``feature_cols``, ``label_cols``, ``sample_weight_col``, ``validation`` (ratio or column),
      ``input_shapes``/``label_shapes`` (reshape, batch dimension included, e.g.
      ``[[-1, 1, 8, 8]]``), ``transformation_fn`` (``fn(batch dict) -> batch dict``).
    - ``batch_size`` (32), ``val_batch_size``, ``epochs`` (1), ``train_steps_per_epoch``,
      ``validation_steps_per_epoch``, ``shuffle`` (True), ``random_seed``,
      ``partitions_per_process`` (10), ``backward_passes_per_step`` (1),
      ``gradient_compression``, ``train_minibatch_fn``, ``use_gpu`` (True), ``verbose`` (1),
      ``run_id`` (an existing checkpoint of this id resumes training).
    - Horovod's loader settings: ``train_reader_num_workers``/``val_reader_num_workers``,
      ``reader_pool_type``, ``train_async_data_loader_queue_size``/
      ``val_async_data_loader_queue_size``, ``inmemory_cache_all``, ``debug_data_loader``,
      ``transformation_edit_fields``/``transformation_removed_fields``, ``data_module`` (a
      data module class replacing kolo's loader; ``continuous_cols``/``categorical_cols``
      reach it), ``mp_start_method``. No effect (warned once, listed in
      :data:`kolo.estimator.params.NO_EFFECT`): ``compress_sparse_cols``. ``backend``: see
      ``docs/spark.md``.

    Floating-point features and labels are given to the model as float32 (Horovod casts to
    float too); integer labels stay integers (for ``cross_entropy``), and a floating-point
    label with one dimension fewer than its output of several values per row (class indices
    from ``StringIndexer``) is given to losses and metrics as int64.

    Example::

        est = TorchEstimator(num_proc=2, store=store, model=model, optimizer=opt,
                             loss=torch.nn.functional.mse_loss, feature_cols=["x"],
                             label_cols=["y"], label_shapes=[[-1, 1]], epochs=5)
        model = est.fit(df)
        model.getHistory()["train_loss"]
    """

    _param_defaults = staticmethod(torch_estimator_defaults)

    def __init__(self, **kwargs: Any) -> None:
        check_horovod_constructor(kwargs)
        super().__init__(**kwargs)

    def _check_params(self) -> None:
        check_model_and_loss(self._param)

    def get_model_class(self) -> type:
        """The Transformer class ``fit`` returns (Horovod's ``get_model_class``).

        Example::

            assert TorchEstimator().get_model_class() is TorchModel
        """
        return TorchModel

    def _remote_trainer(self, store: Any, meta: PreparedDataset, run_id: str) -> TorchTrainer:
        return TorchTrainer(build_torch_spec(self._param, store, run_id, meta))

    def _make_model(
        self, result: Dict[str, Any], run_id: str, metadata: Dict[str, Any]
    ) -> TorchModel:
        return torch_model(self, result, run_id, metadata)


def check_horovod_constructor(kwargs: Dict[str, Any]) -> None:
    """Horovod's constructor checks of the PyTorch estimators, ``ValueError``s as there
    (:class:`~kolo.exceptions.InvalidValueError`): ``loss`` and ``loss_constructors`` not
    both set, ``backward_passes_per_step`` > 0.

    Example::

        check_horovod_constructor({"backward_passes_per_step": 2})
    """
    from kolo.exceptions import InvalidValueError

    if kwargs.get("loss") is not None and kwargs.get("loss_constructors") is not None:
        raise InvalidValueError(
            "only one of loss_constructors and loss parameters can be specified: pass loss, "
            "or loss_constructors for losses that cannot be pickled"
        )
    passes = kwargs.get("backward_passes_per_step", 1)
    if passes is not None and passes <= 0:
        raise InvalidValueError(f"backward_passes_per_step must be > 0, got {passes}")


def torch_model(
    estimator: Any, result: Dict[str, Any], run_id: str, metadata: Dict[str, Any]
) -> TorchModel:
    """The :class:`~kolo.spark.torch.TorchModel` of a fit of ``estimator`` (the PyTorch or the
    Lightning one): a copy of its model with rank 0's weights (``result["model"]``).

    Example::

        model = torch_model(est, result, "run_1", meta.metadata())
    """
    optimizer = None
    if result.get("optimizer") is not None:
        optimizer = trained_optimizer(estimator.getOptimizer(), result["optimizer"])
    return TorchModel(
        model=trained_model(estimator.getModel(), result["model"]),
        history=result["history"],
        feature_columns=estimator.getFeatureCols(),
        label_columns=estimator.getLabelCols(),
        run_id=run_id,
        _metadata=metadata,
        input_shapes=estimator.getInputShapes(),
        optimizer=optimizer,
        loss=estimator.getLoss(),
        loss_constructors=estimator.getLossConstructors(),
        use_gpu=estimator.getUseGpu(),
    )
