r"""``KoloStrategy``: data-parallel PyTorch Lightning training on kolo's runtime (what
Lightning's removed ``HorovodStrategy`` did, on Lightning 2.x).

One process per rank, started by a kolo launcher (``kolorun -np N python train.py``,
:func:`kolo.spark.run`, :class:`kolo.ray.RayExecutor`); each process drives one device: the
CPU, or the GPU picked by its local rank (the Spark task's GPU under ``kolo.spark.run``). The
strategy

- broadcasts rank 0's parameters and buffers (and optimizer state) when training starts;
- wraps each optimizer in :func:`kolo.torch.DistributedOptimizer`: every gradient's allreduce
  starts while backward is still running (fused by kolo's engine), and the averaged gradients
  are in place right after ``backward`` (so gradient clipping and ``on_before_optimizer_step``
  see the global gradients); with ``accumulate_grad_batches=k`` the reduction runs once per
  ``k`` backward passes;
- implements ``reduce`` / ``all_gather`` / ``broadcast`` / ``barrier`` with kolo's
  collectives, so ``self.log(..., sync_dist=True)``, ``LightningModule.all_gather``,
  ``ModelCheckpoint`` and ``EarlyStopping`` agree across ranks;
- makes Lightning put a ``DistributedSampler`` (``num_replicas=hvd.size()``,
  ``rank=hvd.rank()``) into the ``DataLoader``\\ s;
- writes checkpoints on rank 0 only;
- with ``sync_batchnorm=True``, turns the batch norm layers into :class:`kolo.torch.SyncBatchNorm`
  for the fit (and back at teardown).

The learning rate is not scaled: like Lightning's DDP, a step of ``N`` ranks on ``B`` rows
each equals one step on the ``N * B`` rows (the gradients are averaged).

Example::

    import lightning.pytorch as pl
    from kolo.lightning import KoloStrategy

    trainer = pl.Trainer(strategy=KoloStrategy(), accelerator="cpu", devices=1, max_epochs=5)
    trainer.fit(model, train_loader)          # kolorun -np 2 python train.py
"""

from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager
from typing import Any, Generator, List, Optional, Union

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor

from kolo.lightning import _collectives as collectives
from kolo.lightning.elastic import CommittedCheckpoint
from kolo.lightning.environment import KoloEnvironment, _hvd
from kolo.lightning.layer_sync import KoloSyncBatchNorm

__all__ = ["KoloStrategy"]

log = logging.getLogger(__name__)


def _unwrap(optimizer: Any) -> torch.optim.Optimizer:
    return optimizer._optimizer if isinstance(optimizer, LightningOptimizer) else optimizer


def _is_distributed_optimizer(optimizer: Any) -> bool:
    from kolo.torch.optimizer import _DistributedOptimizerMixin

    return isinstance(optimizer, _DistributedOptimizerMixin)


class KoloStrategy(collectives.KoloRanks, ParallelStrategy):
    """A Lightning ``ParallelStrategy`` on kolo (registered as ``strategy="kolo"``).

    Args:
        accelerator: as for every Lightning strategy (the Trainer fills it in).
        parallel_devices: as for every Lightning strategy; only the kind of device matters:
            each process uses one device, chosen by its local rank.
        checkpoint_io: as for every Lightning strategy.
        precision_plugin: as for every Lightning strategy.
        cluster_environment: default :class:`~kolo.lightning.KoloEnvironment` (ranks from
            kolo).
        compression: ``kolo.torch.Compression.none`` (default), ``.fp16`` or ``.bf16`` for the
            gradients on the wire.
        gradient_predivide_factor: as in :func:`kolo.torch.DistributedOptimizer`.
        groups: as in :func:`kolo.torch.DistributedOptimizer` (``None``: kolo's engine fuses
            the reductions that are ready together).
        sparse_as_dense: as in :func:`kolo.torch.DistributedOptimizer`.

    Example::

        trainer = Trainer(strategy=KoloStrategy(compression=hvd.Compression.fp16),
                          accelerator="gpu", devices=1)
    """

    strategy_name = "kolo"

    def __init__(
        self,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[List[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        compression: Any = None,
        gradient_predivide_factor: float = 1.0,
        groups: Any = None,
        sparse_as_dense: bool = False,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment or KoloEnvironment(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._keep_optimizer_options(
            compression, gradient_predivide_factor, groups, sparse_as_dense
        )
        self._exit_stack: Optional[ExitStack] = None
        self._sync_blocked = False
        self.num_nodes = 1

    # -- ranks and devices ------------------------------------------------------------------

    @property
    def is_distributed(self) -> bool:
        """``True``: Lightning then injects a ``DistributedSampler`` into the loaders."""
        return True

    def set_world_ranks(self) -> None:
        """Joins kolo's job (``hvd.init()``) and tells Lightning's rank-zero helpers the rank."""
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    def setup_environment(self) -> None:
        """Joins kolo's job and pins this process's device."""
        self.set_world_ranks()
        super().setup_environment()

    def model_to_device(self) -> None:
        """Moves the model to :attr:`root_device`."""
        assert self.model is not None
        self.model.to(self.root_device)

    # -- training set-up ----------------------------------------------------------------------

    def setup(self, trainer: Any) -> None:
        """Sets up the model and optimizers, broadcasts rank 0's state and wraps the
        optimizers in ``DistributedOptimizer``."""
        if trainer.state.fn == TrainerFn.FITTING and self._layer_sync is not None:
            # sync_batchnorm=True: kolo's SyncBatchNorm instead of torch.nn.SyncBatchNorm.
            self._layer_sync = KoloSyncBatchNorm()
            assert self.model is not None
            self.model = self._layer_sync.apply(self.model)
        super().setup(trainer)
        hvd = _hvd()
        assert self.lightning_module is not None
        hvd.broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self._exit_stack = ExitStack()
        self._exit_stack.__enter__()
        passes = 1
        if self.lightning_module.automatic_optimization:
            passes = int(trainer.accumulate_grad_batches)
        wrapped = []
        for optimizer in (_unwrap(o) for o in self.optimizers):
            if not _is_distributed_optimizer(optimizer):
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
                optimizer = self._distributed_optimizer(
                    optimizer, self.lightning_module, backward_passes_per_step=passes
                )
            # Lightning runs backward inside the closure it gives step(): the gradients are
            # synchronized in post_backward, and step() must not wait a second time.
            self._exit_stack.enter_context(optimizer.skip_synchronize())
            wrapped.append(optimizer)
        originals = [_unwrap(o) for o in self.optimizers]
        for config in self.lr_scheduler_configs:
            scheduler_optimizer = getattr(config.scheduler, "optimizer", None)
            for original, new in zip(originals, wrapped):
                if scheduler_optimizer is original:
                    config.scheduler.optimizer = new
        self.optimizers = wrapped

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """While Lightning accumulates gradients (``accumulate_grad_batches``), the gradients
        are not synchronized after backward (their reduction waits for the last pass)."""
        self._sync_blocked = True
        try:
            yield None
        finally:
            self._sync_blocked = False

    def post_backward(self, closure_loss: Tensor) -> None:
        """Waits for the gradient allreduces that backward started (unless accumulating)."""
        if self._sync_blocked:
            return
        for optimizer in self.optimizers:
            optimizer = _unwrap(optimizer)
            if _is_distributed_optimizer(optimizer) and (optimizer._touched or optimizer._pending):
                optimizer.synchronize()

    def teardown(self) -> None:
        """Leaves ``skip_synchronize``, removes the gradient hooks of the optimizers it wrapped
        (so a later ``fit`` of the same module starts clean) and tears down like every
        Lightning strategy (kolo's job stays joined, for later ``fit``/``test`` calls)."""
        if self._exit_stack is not None:
            self._exit_stack.__exit__(None, None, None)
            self._exit_stack = None
        for optimizer in self.optimizers:
            optimizer = _unwrap(optimizer)
            if _is_distributed_optimizer(optimizer):
                for handle in optimizer._hook_handles:
                    if hasattr(handle, "remove"):
                        handle.remove()
                optimizer._hook_handles.clear()
        if isinstance(self._layer_sync, KoloSyncBatchNorm) and self.model is not None:
            self.model = self._layer_sync.revert(self.model)
        super().teardown()

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Optional[bool] = None) -> Any:
        """Loads a checkpoint through the ``CheckpointIO``, or, for
        ``ckpt_path=state.ckpt_path`` of an elastic fit (:mod:`kolo.lightning.elastic`), a
        copy of the state's last commit from host memory.

        Example::

            trainer.fit(state.model, loader, ckpt_path=state.ckpt_path)
        """
        if isinstance(checkpoint_path, CommittedCheckpoint):
            return checkpoint_path.load()
        if weights_only is None:  # (Lightning before 2.5 has no weights_only)
            return super().load_checkpoint(checkpoint_path)
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)

    # -- collectives ----------------------------------------------------------------------------

    def reduce(
        self,
        tensor: Any,
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Any:
        """``tensor`` reduced over the ranks (``"mean"`` by default; ``"sum"``, ``"max"``,
        ``"min"``, ``"product"``); non-tensors are returned as they are.

        Example::

            total = trainer.strategy.reduce(torch.tensor(3.0), reduce_op="sum")
        """
        return collectives.reduce(tensor, group, reduce_op, "KoloStrategy.reduce")

    def all_gather(
        self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False
    ) -> Tensor:
        """Every rank's ``tensor`` stacked along a new first dimension (``[size, *shape]``);
        gradients flow back through it with ``sync_grads=True``.

        Example::

            everyone = trainer.strategy.all_gather(torch.tensor([hvd.rank()]))   # [[0], [1]]
        """
        return collectives.all_gather(tensor, group, sync_grads)

    # -- registry --------------------------------------------------------------------------------

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Registers ``"kolo"`` in Lightning's ``StrategyRegistry`` (done when
        :mod:`kolo.lightning` is imported).

        Example::

            from lightning.pytorch.strategies import StrategyRegistry
            KoloStrategy.register_strategies(StrategyRegistry)
        """
        if cls.strategy_name in strategy_registry:
            return
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="data-parallel training on kolo (kolorun, kolo.spark.run, RayExecutor)",
        )
