"""The rank side of :class:`kolo.spark.keras.KerasEstimator`, under Horovod's module path
(``horovod.spark.keras.remote``): the estimator core's Keras loop
(:mod:`kolo.estimator.keras_trainer`), which ``kolo.spark.run`` runs on every rank, and the
run's checkpoint.

Example::

    from kolo.spark.keras.remote import load_checkpoint

    ckpt = load_checkpoint(store, "run_1")
    print(ckpt["epoch"], ckpt["history"]["loss"])
"""

from kolo.estimator.keras_trainer import KerasSpec as KerasTrainingSpec
from kolo.estimator.keras_trainer import KerasTrainer as KerasRemoteTrainer
from kolo.estimator.keras_trainer import load_checkpoint

__all__ = ["KerasRemoteTrainer", "KerasTrainingSpec", "load_checkpoint"]
