"""Horovod's ``horovod.tensorflow`` API for TensorFlow 2: ``import kolo.tensorflow as hvd``.

Collectives on TensorFlow tensors, eagerly and inside ``tf.function``, with Horovod's names,
signatures and gradients, on kolo's framework-agnostic engine: no custom op is compiled
against TensorFlow, so one kolo wheel works with every TensorFlow 2 version. Inside a graph
each call crosses into the engine once for all its tensors (``grouped_allreduce`` and
``DistributedGradientTape`` put every gradient into one ``tf.numpy_function`` node); XLA
(``jit_compile=True``) is refused with :class:`~kolo.exceptions.ConfigError`.

Example (Horovod's TensorFlow 2 custom training loop)::

    import tensorflow as tf
    import kolo.tensorflow as hvd

    hvd.init()
    opt = tf.keras.optimizers.Adam(0.001 * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value
"""

# First: kolo.keras loads triton (torch's compiler, when installed) before TensorFlow, so a
# process that also uses torch does not abort (see kolo.keras._preload).
from kolo.keras import _preload  # noqa: F401

# isort: split
from kolo._core import (
    ReduceOp,
    ccl_built,
    cuda_built,
    ddl_built,
    engine_stats,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from kolo.exceptions import HorovodInternalError
from kolo.tensorflow import elastic
from kolo.tensorflow._optimizer import DistributedOptimizer
from kolo.tensorflow._reductions import (
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from kolo.tensorflow._tape import DistributedGradientTape, PartialDistributedGradientTape
from kolo.tensorflow.compression import Compression
from kolo.tensorflow.functions import (
    BroadcastGlobalVariablesHook,
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    refs_to_vars,
    vars_to_refs,
)
from kolo.tensorflow.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    check_num_rank_power_of_2,
    cross_rank,
    cross_size,
    global_process_set,
    grouped_allgather,
    handle_average_backwards_compatibility,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_rank_op,
    local_size,
    local_size_op,
    process_set_included_op,
    rank,
    rank_op,
    remove_process_set,
    shutdown,
    size,
    size_op,
)
from kolo.tensorflow.sync_batch_norm import SyncBatchNormalization

__all__ = [
    "Adasum",
    "Average",
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "check_num_rank_power_of_2",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "engine_stats",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "handle_average_backwards_compatibility",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "refs_to_vars",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
    "vars_to_refs",
]
