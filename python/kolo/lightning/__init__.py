"""PyTorch Lightning on kolo: ``Trainer(strategy="kolo")`` or ``Trainer(strategy=KoloStrategy())``,
and ``Fabric(strategy="kolo")`` (:class:`KoloFabricStrategy`).

Lightning 2.x (the ``lightning`` package) resolves a strategy name through its registries
(``StrategyRegistry`` for the Trainer, ``STRATEGY_REGISTRY`` for Fabric), which have no plugin
entry point for other packages; importing this module registers ``"kolo"`` in both. So import
:mod:`kolo.lightning` before building the ``Trainer``/``Fabric`` (or pass the strategy object).

Example (``kolorun -np 2 python train.py``)::

    import lightning.pytorch as pl
    import kolo.lightning  # registers strategy="kolo"

    trainer = pl.Trainer(strategy="kolo", accelerator="cpu", devices=1, max_epochs=3)
    trainer.fit(model, train_dataloaders=loader)   # loader's sampler becomes distributed
"""

from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.pytorch.strategies import StrategyRegistry

from kolo.lightning import elastic
from kolo.lightning.environment import KoloEnvironment, isolate_mpi_singleton
from kolo.lightning.fabric import KoloFabricStrategy
from kolo.lightning.layer_sync import KoloSyncBatchNorm
from kolo.lightning.strategy import KoloStrategy

__all__ = ["KoloEnvironment", "KoloFabricStrategy", "KoloStrategy", "KoloSyncBatchNorm", "elastic"]

isolate_mpi_singleton()
KoloStrategy.register_strategies(StrategyRegistry)
KoloFabricStrategy.register_strategies(STRATEGY_REGISTRY)
