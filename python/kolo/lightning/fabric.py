"""``KoloFabricStrategy``: ``lightning.Fabric`` on kolo's runtime (registered as
``strategy="kolo"`` in Fabric's registry when :mod:`kolo.lightning` is imported).

``fabric.setup(model, optimizer)`` broadcasts rank 0's parameters, buffers and optimizer
state and wraps the optimizer in :func:`kolo.torch.DistributedOptimizer` (named by the
model's parameter names): ``fabric.backward(loss)`` starts each gradient's allreduce while
backward runs and ``optimizer.step()`` waits for them. ``fabric.setup_dataloaders`` injects a
``DistributedSampler`` for ``hvd.size()`` replicas; ``fabric.all_reduce``/``all_gather``/
``broadcast``/``barrier`` use kolo's collectives; ``fabric.save`` writes on rank 0 only;
``fabric.no_backward_sync(model)`` accumulates gradients locally (the reduction waits for the
first backward outside it).

Example (``kolorun -np 2 python train.py``)::

    from lightning.fabric import Fabric
    import kolo.lightning  # registers strategy="kolo"

    fabric = Fabric(strategy="kolo", accelerator="cpu", devices=1)
    fabric.launch()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = fabric.setup_dataloaders(loader)
    for x, y in loader:
        optimizer.zero_grad()
        fabric.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Generator, List, Optional, Tuple, Union

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.plugins.precision import Precision
from lightning.fabric.strategies.parallel import ParallelStrategy
from lightning.fabric.strategies.strategy import _BackwardSyncControl
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.utilities.types import ReduceOp
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor
from torch.nn import Module

from kolo.lightning import _collectives as collectives
from kolo.lightning.environment import KoloEnvironment, _hvd

__all__ = ["KoloFabricStrategy"]


class _KoloBackwardSyncControl(_BackwardSyncControl):
    """``fabric.no_backward_sync(model)``: the backward passes inside it only accumulate
    gradients locally; the first backward outside it starts the allreduces (of the summed
    gradients), as Horovod's ``backward_passes_per_step`` does."""

    def __init__(self, strategy: KoloFabricStrategy) -> None:
        self.strategy = strategy

    @contextmanager
    def no_backward_sync(self, module: Module, enabled: bool) -> Generator[None, None, None]:
        if enabled:
            # One more pass before each gradient's reduction starts (the DistributedOptimizer
            # resets every count when it synchronizes).
            for optimizer in self.strategy._wrapped:
                for p in optimizer._allreduce_delay:
                    optimizer._allreduce_delay[p] += 1
        yield None


class KoloFabricStrategy(collectives.KoloRanks, ParallelStrategy):
    """A Fabric ``ParallelStrategy`` on kolo (``Fabric(strategy="kolo")``).

    Args:
        accelerator: as for every Fabric strategy.
        parallel_devices: as for every Fabric strategy.
        checkpoint_io: as for every Fabric strategy.
        precision: as for every Fabric strategy.
        cluster_environment: default :class:`~kolo.lightning.KoloEnvironment`.
        compression: as in :func:`kolo.torch.DistributedOptimizer`.
        gradient_predivide_factor: as in :func:`kolo.torch.DistributedOptimizer`.
        groups: as in :func:`kolo.torch.DistributedOptimizer`.
        sparse_as_dense: as in :func:`kolo.torch.DistributedOptimizer`.

    Example::

        fabric = Fabric(strategy=KoloFabricStrategy(), accelerator="cpu", devices=1)
    """

    strategy_name = "kolo"

    def __init__(
        self,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[List[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision: Optional[Precision] = None,
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
            precision=precision,
        )
        self._keep_optimizer_options(
            compression, gradient_predivide_factor, groups, sparse_as_dense
        )
        self.num_nodes = 1
        self._wrapped: List[Any] = []
        self._backward_sync_control = _KoloBackwardSyncControl(self)

    def setup_environment(self) -> None:
        """Joins kolo's job, tells the rank-zero helpers the rank and pins the device."""
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank
        super().setup_environment()

    def module_to_device(self, module: Module) -> None:
        """Moves ``module`` to :attr:`root_device`."""
        module.to(self.root_device)

    def setup_module(self, module: Module) -> Module:
        """Broadcasts rank 0's parameters and buffers."""
        _hvd().broadcast_parameters(module.state_dict(), root_rank=0)
        return module

    def setup_module_and_optimizers(
        self, module: Module, optimizers: List[torch.optim.Optimizer], scheduler: Any = None
    ) -> Tuple[Module, List[torch.optim.Optimizer], Any]:
        """Broadcasts rank 0's state and wraps each optimizer in ``DistributedOptimizer``."""
        module = self.setup_module(module)
        hvd = _hvd()
        wrapped = []
        for optimizer in optimizers:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            wrapped.append(self._distributed_optimizer(optimizer, module))
        if scheduler is not None and len(wrapped) == 1:
            scheduler.optimizer = wrapped[0]
        self._wrapped.extend(wrapped)
        return module, wrapped, scheduler

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Wraps an optimizer set up on its own (parameters named by position)."""
        hvd = _hvd()
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        wrapped = hvd.DistributedOptimizer(
            optimizer, compression=self.compression or hvd.Compression.none
        )
        self._wrapped.append(wrapped)
        return wrapped

    def all_reduce(
        self,
        tensor: Any,
        group: Optional[Any] = None,
        reduce_op: Optional[Union[ReduceOp, str]] = "mean",
    ) -> Any:
        """``tensor`` reduced over the ranks (see :func:`kolo.lightning._collectives.reduce`)."""
        return collectives.reduce(tensor, group, reduce_op, "KoloFabricStrategy.all_reduce")

    def all_gather(
        self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False
    ) -> Tensor:
        """Every rank's ``tensor`` stacked along a new first dimension."""
        return collectives.all_gather(tensor, group, sync_grads)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Registers ``"kolo"`` in Fabric's ``STRATEGY_REGISTRY`` (done when
        :mod:`kolo.lightning` is imported).

        Example::

            from lightning.fabric.strategies import STRATEGY_REGISTRY
            KoloFabricStrategy.register_strategies(STRATEGY_REGISTRY)
        """
        if cls.strategy_name in strategy_registry:
            return
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="data-parallel Fabric on kolo (kolorun, kolo.spark.run, RayExecutor)",
        )
