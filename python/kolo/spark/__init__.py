"""kolo on Spark: Horovod-compatible names under ``kolo.spark``.

- :func:`run` runs a function on ``num_proc`` ranks of a Spark barrier stage
  (``horovod.spark.run``); :mod:`kolo.spark.task` has the helpers for inside that function.
- :func:`run_elastic` runs an elastic training function on ``num_proc`` to ``max_num_proc``
  ranks of non-barrier Spark tasks that survive lost executors
  (``horovod.spark.run_elastic``; docs/elastic.md).
- ``kolo.spark.common.store`` holds the stores (``Store.create``);
  ``kolo.spark.common.backend`` Horovod's ``Backend``/``SparkBackend``, through which the
  estimators can launch.
- :func:`jar_path` is kolo's Spark plugin jar (``kolo.spark.plugin.configure`` adds it to a
  ``SparkSession.Builder``): lost executors fail a launch at once with the cluster manager's
  reason, and ``run_elastic`` hears of executors added and removed.

Importing this package imports neither PySpark nor torch.

Example::

    import kolo.spark

    def fn(magic_number):
        import kolo.torch as hvd
        hvd.init()
        return magic_number, hvd.rank(), hvd.local_rank(), hvd.size()

    results = kolo.spark.run(fn, args=(42,), num_proc=2)
"""

from kolo.spark.plugin import jar_path
from kolo.spark.runner import run, run_elastic

__all__ = ["jar_path", "run", "run_elastic"]
