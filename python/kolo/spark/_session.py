"""Classic Spark session or Spark Connect client: the one place kolo.spark tells them apart.

A Spark Connect client (``SparkSession.builder.remote("sc://...")``, Databricks shared and
serverless clusters) has no ``SparkContext``: no RDDs, broadcasts, job groups or ``_jvm``.
Code that needs the context asks :func:`is_connect` first and takes a DataFrame-only path.

Example::

    from kolo.spark._session import active_session, default_parallelism, is_connect

    spark = active_session()
    if is_connect(spark):
        print("Spark Connect; default parallelism", default_parallelism(spark))
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["active_session", "default_parallelism", "is_connect"]

#: Rows of the probe that counts the partitions Spark gives a leaf scan by default.
_PROBE_ROWS = 1 << 16


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client session (no ``SparkContext``).

    Example::

        is_connect(SparkSession.builder.remote("sc://127.0.0.1:15002").getOrCreate())  # True
    """
    return type(session).__module__.startswith("pyspark.sql.connect")


def active_session() -> Optional[Any]:
    """The active SparkSession (classic or Spark Connect), or None.

    Example::

        spark = active_session()
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - pyspark is a dependency of kolo.spark
        return None
    return SparkSession.getActiveSession()


def default_parallelism(session: Any) -> int:
    """``spark.sparkContext.defaultParallelism`` of a classic session; on Spark Connect (which
    cannot read it) ``spark.default.parallelism`` when set, else the number of partitions the
    server gives a leaf scan by default (Spark's ``leafNodeDefaultParallelism``, which is the
    default parallelism unless configured), counted by one small query.

    Example::

        default_parallelism(spark)   # 2 on local[2]
    """
    if not is_connect(session):
        return int(session.sparkContext.defaultParallelism)
    configured = session.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    from pyspark.sql import functions as F

    ids = session.range(_PROBE_ROWS).select(F.spark_partition_id().alias("p"))
    return int(ids.agg(F.max("p").alias("top")).first()["top"]) + 1
