"""``KoloSyncBatchNorm``: Lightning's ``sync_batchnorm=True`` on kolo (a ``LayerSync``).

Lightning's own ``TorchSyncBatchNorm`` swaps in ``torch.nn.SyncBatchNorm``, which needs a
``torch.distributed`` group; with :class:`~kolo.lightning.KoloStrategy` the batch norm layers
become :class:`kolo.torch.SyncBatchNorm` instead (statistics over every rank's batch, through
kolo's collectives). The layers keep their parameter and buffer tensors, so optimizers built
before or after the swap both work.

Example::

    trainer = Trainer(strategy="kolo", sync_batchnorm=True)   # KoloStrategy swaps the plugin
"""

from __future__ import annotations

import torch
from lightning.pytorch.plugins.layer_sync import LayerSync
from torch.nn import Module
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["KoloSyncBatchNorm"]


def _copy_state(source: _BatchNorm, target: _BatchNorm) -> _BatchNorm:
    """Moves ``source``'s parameters and buffers (the same tensors) into ``target``."""
    if source.affine:
        target.weight = source.weight
        target.bias = source.bias
    target.running_mean = source.running_mean
    target.running_var = source.running_var
    target.num_batches_tracked = source.num_batches_tracked
    target.train(source.training)
    return target


class _PlainBatchNorm(_BatchNorm):
    """What :meth:`KoloSyncBatchNorm.revert` turns a synchronized layer back into: a batch norm
    for inputs of any rank (``(N, C, ...)``)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (N, C, ...), got {input.dim()}D input")


class KoloSyncBatchNorm(LayerSync):
    """Converts every batch norm layer of a model to :class:`kolo.torch.SyncBatchNorm` (and
    back).

    Example::

        model = KoloSyncBatchNorm().apply(model)      # BatchNorm*d -> kolo.torch.SyncBatchNorm
    """

    def apply(self, model: Module) -> Module:
        """``model`` with its batch norm layers synchronized over every rank."""
        from kolo.torch import SyncBatchNorm

        if isinstance(model, _BatchNorm) and not isinstance(model, SyncBatchNorm):
            converted = SyncBatchNorm(
                model.num_features,
                model.eps,
                model.momentum,
                model.affine,
                model.track_running_stats,
            )
            return _copy_state(model, converted)
        for name, child in model.named_children():
            model.add_module(name, self.apply(child))
        return model

    def revert(self, model: Module) -> Module:
        """``model`` with the layers :meth:`apply` converted turned back into plain batch
        norms."""
        from kolo.torch import SyncBatchNorm

        if isinstance(model, SyncBatchNorm):
            plain = _PlainBatchNorm(
                model.num_features,
                model.eps,
                model.momentum,
                model.affine,
                model.track_running_stats,
            )
            return _copy_state(model, plain)
        for name, child in model.named_children():
            model.add_module(name, self.revert(child))
        return model
