"""The rank side of :class:`kolo.spark.lightning.TorchEstimator`, under Horovod's module path
(``horovod.spark.lightning.remote``): the estimator core's Lightning loop
(:mod:`kolo.estimator.lightning_trainer`), which ``kolo.spark.run`` runs on every rank.

Example::

    from kolo.spark.lightning.remote import RemoteLightningTrainer

    result = RemoteLightningTrainer(spec)()     # in a rank: {"model": ..., "history": ...}
"""

from kolo.estimator.lightning_trainer import LightningSpec
from kolo.estimator.lightning_trainer import LightningTrainer as RemoteLightningTrainer

__all__ = ["LightningSpec", "RemoteLightningTrainer"]
