"""Pieces shared by the Spark estimators, under Horovod's module names.

Example::

    from kolo.spark.common.store import FilesystemStore
"""

__all__ = []
