"""Horovod's ``horovod.tensorflow.keras.elastic``: :mod:`kolo.keras.elastic`."""

from kolo.keras.elastic import *  # noqa: F403 - the same names, under Horovod's module path
from kolo.keras.elastic import __all__  # noqa: F401
