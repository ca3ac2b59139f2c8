"""Horovod's ``horovod.spark.common.store`` names, backed by :mod:`kolo.store`.

Example::

    from kolo.spark.common.store import Store

    store = Store.create("s3://bucket/experiments")
    store.get_checkpoint_path("run_1")     # 's3://bucket/experiments/runs/run_1'
"""

from kolo.store import *  # noqa: F403 - the same names, under Horovod's module path
from kolo.store import __all__  # noqa: F401
