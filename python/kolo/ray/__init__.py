"""kolo on Ray: Horovod's ``horovod.ray.RayExecutor`` on kolo's runtime.

:class:`RayExecutor` places ``num_workers`` actors (or ``num_hosts`` x ``num_workers_per_host``,
one placement-group bundle per node), registers them with a kolo job driver exactly as
``kolo.spark.run`` registers its ranks (ranks consecutive per Ray node, ``local_rank`` and
``cross_rank`` right), and runs functions or stateful executables in them with fail-fast: a
rank that raises or an actor that dies makes the call raise
:class:`kolo.exceptions.RankFailedError` and stops the other actors. Given ``min_workers`` (and
``max_workers``) instead, it runs elastically: workers follow the Ray cluster's nodes (a node
added is a scale-up, a lost node or actor a failure the others survive); so does
:class:`ElasticRayExecutor` (Horovod's older elastic API, :mod:`kolo.ray.elastic`).

:class:`BaseHorovodWorker` (also in :mod:`kolo.ray.worker`) is Horovod's worker actor class;
the executor's actors are instances of it, so ``executor.workers`` answer its calls.

:class:`TorchEstimator` trains a PyTorch model on the executor's ranks from a
``ray.data.Dataset`` or Parquet in a store, with the Spark estimator's training loop.

Importing this package does not import Ray (nor PySpark).

Example::

    import ray
    from kolo.ray import RayExecutor

    def simple_fn():
        import kolo.torch as hvd
        hvd.init()
        return hvd.rank()

    ray.init()
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=2)
    executor.start()
    print(executor.run(simple_fn))  # [0, 1]
    executor.shutdown()
"""

from kolo.ray.elastic import ElasticRayExecutor, ElasticRaySettings, RayHostDiscovery
from kolo.ray.estimator import TorchEstimator, TrainingResult
from kolo.ray.executor import RayExecutor, RaySettings
from kolo.ray.worker import BaseHorovodWorker

__all__ = [
    "BaseHorovodWorker",
    "ElasticRayExecutor",
    "ElasticRaySettings",
    "RayExecutor",
    "RayHostDiscovery",
    "RaySettings",
    "TorchEstimator",
    "TrainingResult",
]
