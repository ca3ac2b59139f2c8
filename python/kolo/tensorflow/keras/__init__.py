"""Horovod's ``horovod.tensorflow.keras``: the same API as :mod:`kolo.keras` (Keras on the
TensorFlow backend), under Horovod's module path, so ``import horovod.tensorflow.keras as hvd``
becomes ``import kolo.tensorflow.keras as hvd``. The reduction ops (``Average``, ``Sum``,
``Adasum``, ``Min``, ``Max``, ``Product``) and ``global_process_set`` are kolo.keras's.

Example::

    import kolo.tensorflow.keras as hvd

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
"""

import importlib

from kolo.keras import *  # noqa: F403 - the same names, under Horovod's module path
from kolo.keras import __all__  # noqa: F401

# This package's own submodules (the star import bound kolo.keras's under the same names, and
# `from kolo.tensorflow.keras import callbacks` would keep those).
callbacks = importlib.import_module("kolo.tensorflow.keras.callbacks")
elastic = importlib.import_module("kolo.tensorflow.keras.elastic")
