"""Horovod's ``horovod.tensorflow.keras`` API for Keras 3: ``import kolo.keras as hvd``.

Works with the TensorFlow backend (eagerly and inside the ``tf.function`` train step that
``model.fit`` compiles) and with the torch backend, on kolo's framework-agnostic engine: no
custom op is compiled against TensorFlow, so one kolo wheel works with every Keras 3 /
TensorFlow / torch version.

Example::

    import keras
    import kolo.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(
        x, y,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
        ],
        verbose=1 if hvd.rank() == 0 else 0,
    )
"""

# First: loads triton before anything imports Keras (and with it TensorFlow).
from kolo.keras import _preload  # noqa: F401

# isort: split
from kolo._core import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    engine_stats,
    gloo_built,
    gloo_enabled,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
    start_timeline,
    stop_timeline,
)
from kolo._lifecycle import init, shutdown
from kolo.exceptions import HorovodInternalError
from kolo.keras import callbacks, elastic
from kolo.keras.compression import Compression
from kolo.keras.functions import broadcast_global_variables, broadcast_variables, load_model
from kolo.keras.ops import (
    allgather,
    allgather_object,
    allreduce,
    barrier,
    broadcast,
    broadcast_object,
    grouped_allreduce,
    reducescatter,
)
from kolo.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from kolo.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "engine_stats",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "init",
    "is_homogeneous",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
