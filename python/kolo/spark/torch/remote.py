"""The rank side of :class:`kolo.spark.torch.TorchEstimator`, under Horovod's module path
(``horovod.spark.torch.remote``): the estimator core's PyTorch loop
(:mod:`kolo.estimator.torch_trainer`), which ``kolo.spark.run`` runs on every rank, and the
run's checkpoint.

Example::

    from kolo.spark.torch.remote import load_checkpoint

    ckpt = load_checkpoint(store, "run_1")
    print(ckpt["epoch"], ckpt["history"]["train_loss"])
"""

from kolo.estimator.torch_spec import RemoteLossConstructor, trained_model
from kolo.estimator.torch_spec import TorchSpec as TrainingSpec
from kolo.estimator.torch_trainer import TorchTrainer as RemoteTrainer
from kolo.estimator.torch_trainer import load_checkpoint

__all__ = [
    "RemoteLossConstructor",
    "RemoteTrainer",
    "TrainingSpec",
    "load_checkpoint",
    "trained_model",
]
