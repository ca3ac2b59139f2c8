"""A plain ``torch.nn.Module`` with an optimizer and losses as a ``LightningModule``, for the
Lightning estimator (Horovod's ``horovod/spark/lightning/legacy.py``): Horovod's Lightning
``TorchEstimator`` trains a model that is not a ``LightningModule`` this way, from the
estimator's ``optimizer``, ``loss`` (or ``loss_constructors``), ``loss_weights`` and
``sample_weight_col``. The wrapped model is the module's ``_model``.

Example::

    module = to_lightning_module(net, optimizer, [F.mse_loss], None, ["x"], ["y"], None)
    trainer.fit(module, train_batches)
"""

from __future__ import annotations

from typing import Any, List, Optional

#: The attribute holding the wrapped model (its weights' prefix in the module's state).
INNER = "_model"


def to_lightning_module(
    model: Any,
    optimizer: Any,
    losses: List[Any],
    loss_weights: Optional[List[float]],
    feature_cols: List[str],
    label_cols: List[str],
    sample_weight_col: Optional[str],
) -> Any:
    """A ``LightningModule`` training ``model`` as Horovod's legacy path does: features and
    labels as float, each label reshaped to its output's shape when the element counts
    match, the losses weighted by ``loss_weights`` (default ``1 / len(label_cols)`` each) and
    by the sample weights (``reduction="none"``); it logs ``train_loss`` and ``val_loss``. The
    optimizer is rebuilt on the module's parameters with ``optimizer``'s class and state.

    Example::

        module = to_lightning_module(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                     [F.mse_loss], None, ["x"], ["y"], "weight")
    """
    import lightning.pytorch as pl

    from kolo.estimator.torch_trainer import _loss_with_weights

    optimizer_cls, optimizer_state = type(optimizer), optimizer.state_dict()
    if len(losses) == 1:
        losses = losses * len(label_cols)
    weights = loss_weights or [1.0 / len(label_cols)] * len(label_cols)

    class EstimatorLightningModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, INNER, model)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self, INNER)(*args, **kwargs)

        def configure_optimizers(self) -> Any:
            rebuilt = optimizer_cls(self.parameters(), lr=1)
            rebuilt.load_state_dict(optimizer_state)
            return rebuilt

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self._step(batch)
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self._step(batch)
            self.log("val_loss", loss, sync_dist=True)
            return loss

        def _step(self, batch: Any) -> Any:
            inputs = [batch[c].float() for c in feature_cols]
            labels = [batch[c].float() for c in label_cols]
            outputs = self(*inputs)
            if not isinstance(outputs, (tuple, list)):
                outputs = [outputs]
            labels = [
                y.reshape(out.shape) if out.numel() == y.numel() else y
                for out, y in zip(outputs, labels)
            ]
            sample_weights = batch[sample_weight_col].float() if sample_weight_col else None
            total = 0
            for out, y, loss_fn, weight in zip(outputs, labels, losses, weights):
                if sample_weights is None:
                    value = loss_fn(out, y)
                else:
                    value = _loss_with_weights(loss_fn, out, y, sample_weights)
                total = total + value * weight
            return total

    return EstimatorLightningModule()
