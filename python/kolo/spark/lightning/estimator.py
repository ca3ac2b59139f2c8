"""``TorchEstimator``: a Spark ML Estimator that trains a PyTorch Lightning ``LightningModule``
with kolo on Spark executors (Horovod's ``horovod.spark.lightning.TorchEstimator``) and
returns a :class:`~kolo.spark.torch.TorchModel` (a Spark ML Transformer).

The module defines its own training: ``training_step(batch, batch_idx)`` (and optionally
``validation_step``) receives ``batch`` as a dict ``{column: tensor}`` of the feature, label
and sample weight columns; ``configure_optimizers`` gives the optimizer; metrics are what it
logs with ``self.log`` (``sync_dist=True`` averages them over the ranks).

Example::

    import lightning.pytorch as pl
    import torch
    from kolo.spark.common.store import Store
    from kolo.spark.lightning import TorchEstimator

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self(batch["features"]), batch["label"])
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    est = TorchEstimator(num_proc=2, store=Store.create("/tmp/kolo-store"), model=Net(),
                         feature_cols=["features"], label_cols=["label"], epochs=5)
    model = est.fit(train_df)
    predictions = model.transform(test_df)      # adds label__output
"""

from __future__ import annotations

from typing import Any, Dict

from kolo.estimator._legacy_lightning import INNER, to_lightning_module
from kolo.estimator.checks import FIX_FN, FIX_MODEL, check_shapes, pickled
from kolo.estimator.dataset import PreparedDataset
from kolo.estimator.lightning_trainer import LightningSpec, LightningTrainer
from kolo.estimator.spec import spec_fields
from kolo.estimator.torch_spec import check_model_and_loss, losses_from
from kolo.exceptions import InvalidArgumentError, InvalidValueError
from kolo.spark.common.estimator import KoloEstimator
from kolo.spark.common.params import LightningEstimatorParams, lightning_estimator_defaults

# MIN_PL_VERSION: Horovod's name here (horovod.spark.lightning.estimator.MIN_PL_VERSION).
from kolo.spark.lightning._version import MIN_PL_VERSION as MIN_PL_VERSION
from kolo.spark.lightning._version import check_lightning_version
from kolo.spark.torch.estimator import check_horovod_constructor, torch_model
from kolo.spark.torch.model import TorchModel

__all__ = ["TorchEstimator", "inner_state"]

#: Parameters of the plain PyTorch estimator that a LightningModule defines itself.
_DEFINED_BY_THE_MODULE = {
    "optimizer": "return it from the module's configure_optimizers()",
    "loss": "compute the loss in the module's training_step()",
    "loss_constructors": "compute the loss in the module's training_step()",
    "loss_weights": "weigh the losses in the module's training_step()",
    "metrics": "log metrics with self.log(..., sync_dist=True) in the module",
    "train_minibatch_fn": "override the module's training_step() (or use manual optimization)",
}

#: The parameters Horovod refuses with a ``ValueError`` when the model is a LightningModule.
_HOROVOD_VALUE_ERRORS = ("optimizer", "loss", "loss_weights")

#: Trainer arguments the estimator sets itself.
_SET_BY_THE_ESTIMATOR = {
    "strategy": "kolo's KoloStrategy is always used",
    "devices": "each rank drives one device; set num_proc for more ranks",
    "num_nodes": "the ranks come from num_proc",
    "max_epochs": "set epochs=",
    "accelerator": "set use_gpu= / num_gpus=",
    "logger": "set logger=",
    "callbacks": "set callbacks=",
    "profiler": "set profiler=",
}


class TorchEstimator(KoloEstimator, LightningEstimatorParams):
    """Trains a ``lightning.pytorch.LightningModule`` on a Spark DataFrame with kolo.

    Keyword arguments are the parameters (each also has ``getX``/``setX``):

    - ``num_proc``, ``store``, ``model`` (the LightningModule), ``feature_cols``,
      ``label_cols``, ``sample_weight_col``, ``validation`` (ratio or column),
      ``input_shapes``/``label_shapes``, ``transformation_fn`` (``fn(batch dict) -> batch
      dict``), ``batch_size`` (32), ``val_batch_size``, ``epochs`` (1),
      ``train_steps_per_epoch``, ``validation_steps_per_epoch``, ``shuffle`` (True),
      ``shuffle_buffer_size``, ``random_seed``, ``partitions_per_process`` (10),
      ``backward_passes_per_step`` (1; Lightning's ``accumulate_grad_batches``),
      ``gradient_compression``, ``use_gpu`` (True), ``verbose`` (1), ``run_id`` (an existing
      checkpoint of this id resumes training), ``callbacks`` (Lightning callbacks).
    - Horovod's Lightning ones: ``trainer_args`` (more ``Trainer`` keyword arguments),
      ``logger`` (default: TensorBoard event logs under the run's ``logs/`` in the store),
      ``log_every_n_steps`` (50), ``terminate_on_nan`` (False), ``profiler``, ``num_gpus``.
    - Not for a LightningModule (:class:`~kolo.exceptions.InvalidArgumentError` when set;
      ``InvalidValueError``, a ``ValueError`` as in Horovod, for the first three):
      ``optimizer``, ``loss``, ``loss_weights``, ``loss_constructors``, ``metrics``,
      ``train_minibatch_fn``.
    - A plain ``torch.nn.Module`` as ``model`` trains as in Horovod's legacy path: wrapped in
      a LightningModule from ``optimizer``, ``loss`` or ``loss_constructors``,
      ``loss_weights`` (default ``1 / len(label_cols)`` each) and ``sample_weight_col``; it
      logs ``train_loss``/``val_loss``, and the returned model is the plain module.
    - Horovod's loader settings, as for :class:`kolo.spark.torch.TorchEstimator`;
      ``data_module`` is a ``LightningDataModule`` class built with Horovod's keyword
      arguments and given to ``Trainer.fit(datamodule=)``. No effect (warned once, listed in
      :data:`kolo.estimator.params.NO_EFFECT`): ``compress_sparse_cols``,
      ``loader_num_epochs`` (it reaches a ``data_module`` as ``num_reader_epochs``).

    Example::

        est = TorchEstimator(num_proc=2, store=store, model=Net(), feature_cols=["x"],
                             label_cols=["y"], validation=0.2, epochs=5, run_id="net_1")
        model = est.fit(df)
        model.getHistory()["train_loss"]          # what the module logged, per epoch
    """

    _param_defaults = staticmethod(lightning_estimator_defaults)

    def __init__(self, **kwargs: Any) -> None:
        # As Horovod's: an unsupported Lightning fails at construction, not on the ranks.
        check_lightning_version()
        check_horovod_constructor(kwargs)
        super().__init__(**kwargs)

    def get_model_class(self) -> type:
        """The Transformer class ``fit`` returns (Horovod's ``get_model_class``).

        Example::

            assert TorchEstimator().get_model_class() is TorchModel
        """
        return TorchModel

    def _check_params(self) -> None:
        import lightning.pytorch as pl

        model = self.getModel()
        if model is None:
            raise InvalidArgumentError(
                "model is not set: pass model=<a lightning.pytorch.LightningModule>"
            )
        if self._is_legacy():
            self._check_legacy()
        elif not isinstance(model, pl.LightningModule):
            raise InvalidArgumentError(
                f"model is a {type(model).__name__}, neither a lightning.pytorch.LightningModule "
                "nor a torch.nn.Module: wrap it in a LightningModule"
            )
        else:
            for name, fix in _DEFINED_BY_THE_MODULE.items():
                if self._param(name):
                    error = (
                        InvalidValueError if name in _HOROVOD_VALUE_ERRORS else InvalidArgumentError
                    )
                    raise error(
                        f"{name} is set, but a LightningModule defines it itself: {fix}, and "
                        f"leave {name} unset"
                    )
        trainer_args = self.getTrainerArgs() or {}
        if not isinstance(trainer_args, dict):
            raise InvalidArgumentError(
                f"trainer_args is a {type(trainer_args).__name__}: pass a dict of "
                "lightning.pytorch.Trainer keyword arguments"
            )
        for name, fix in _SET_BY_THE_ESTIMATOR.items():
            if name in trainer_args:
                raise InvalidArgumentError(
                    f"trainer_args[{name!r}] is set by the estimator: {fix}, and remove it from "
                    "trainer_args"
                )
        num_gpus = self.getNumGpus()
        if num_gpus is not None and (not isinstance(num_gpus, int) or num_gpus not in (0, 1)):
            raise InvalidArgumentError(
                f"num_gpus={num_gpus!r}: each rank trains on one device, so give 0 (CPU) or 1; "
                "for more GPUs, raise num_proc"
            )
        check_shapes(self.getInputShapes(), self.getFeatureCols(), "input_shapes", "feature")
        check_shapes(self.getLabelShapes(), self.getLabelCols(), "label_shapes", "label")
        pickled("model", model, FIX_MODEL)

    def _is_legacy(self) -> bool:
        """Whether the model is a plain ``torch.nn.Module`` (Horovod's legacy path)."""
        import lightning.pytorch as pl
        import torch

        model = self.getModel()
        return isinstance(model, torch.nn.Module) and not isinstance(model, pl.LightningModule)

    def _check_legacy(self) -> None:
        """A plain ``torch.nn.Module`` trains from ``optimizer`` and ``loss`` (or
        ``loss_constructors``), as in Horovod; the parameters only a LightningModule's
        ``training_step`` could honour are refused."""
        check_model_and_loss(self._param)
        for name in ("metrics", "train_minibatch_fn"):
            if self._param(name):
                raise InvalidArgumentError(
                    f"{name} is set with a plain torch.nn.Module, which the Lightning estimator "
                    "trains with a loss and optimizer only: train it with "
                    f"kolo.spark.torch.TorchEstimator, or leave {name} unset"
                )

    def _module(self) -> Any:
        """The LightningModule to train: the model, or the plain model wrapped."""
        if not self._is_legacy():
            return self.getModel()
        return to_lightning_module(
            self.getModel(),
            self.getOptimizer(),
            losses_from(self._param),
            self.getLossWeights(),
            self.getFeatureCols(),
            self.getLabelCols(),
            self.getSampleWeightCol(),
        )

    def _remote_trainer(self, store: Any, meta: PreparedDataset, run_id: str) -> LightningTrainer:
        spec = LightningSpec(
            **spec_fields(self._param, store, run_id, meta),
            model_bytes=pickled("model", self._module(), FIX_MODEL),
            callbacks_bytes=pickled("callbacks", self.getCallbacks() or [], FIX_FN),
            logger_bytes=pickled("logger", self.getLogger(), FIX_FN),
            profiler_bytes=pickled("profiler", self.getProfiler(), FIX_FN),
            trainer_args_bytes=pickled("trainer_args", self.getTrainerArgs() or {}, FIX_FN),
            transformation_fn_bytes=pickled(
                "transformation_fn", self.getTransformationFn(), FIX_FN
            ),
            input_shapes=self.getInputShapes(),
            gradient_compression=self.getGradientCompression(),
            use_gpu=self.getUseGpu(),
            num_gpus=self.getNumGpus(),
            log_every_n_steps=self.getLogEveryNSteps(),
            terminate_on_nan=self.getTerminateOnNan(),
            loader_num_epochs=self.getLoaderNumEpochs(),
        )
        return LightningTrainer(spec)

    def _make_model(
        self, result: Dict[str, Any], run_id: str, metadata: Dict[str, Any]
    ) -> TorchModel:
        if self._is_legacy():  # the wrapped model's weights
            result = {**result, "model": inner_state(result["model"])}
        return torch_model(self, result, run_id, metadata)


def inner_state(state_bytes: bytes) -> bytes:
    """The weights of the model a legacy LightningModule wraps, from the module's.

    Example::

        weights = inner_state(result["model"])
    """
    import io

    import torch

    state = torch.load(io.BytesIO(state_bytes), map_location="cpu", weights_only=False)
    prefix = f"{INNER}."
    inner = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    buffer = io.BytesIO()
    torch.save(inner, buffer)
    return buffer.getvalue()
