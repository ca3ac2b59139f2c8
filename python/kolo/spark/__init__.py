"""kolo on Spark: Horovod-compatible names under ``kolo.spark`` (``kolo.spark.common.store``).

Example::

    from kolo.spark.common.store import Store

    store = Store.create("hdfs://namenode:8020/user/me/experiments")
"""
