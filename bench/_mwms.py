"""What bench/keras.py and bench/tensorflow.py share: TensorFlow's
``MultiWorkerMirroredStrategy`` (MWMS) as the peer in kolo's ranks, the small CNN both train, the
synthetic batches, the slowest-rank timing and the interleaved rounds.

TensorFlow is imported inside the functions: each script first fixes ``sys.path`` (its own name
shadows the package) and chooses what loads before TensorFlow.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterator

import numpy as np
from common import free_port


def tf_config(port_list: list[int], rank: int) -> str:
    """``TF_CONFIG`` of worker ``rank`` of a cluster on 127.0.0.1 ``port_list``."""
    return json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in port_list]},
            "task": {"type": "worker", "index": rank},
        }
    )


def build_smallcnn(keras: Any) -> Any:
    """bench/common.py's small CNN in Keras: two 3x3 convolutions with pooling, two dense
    layers, 3x32x32 inputs, 10 logits."""
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def start_mwms(hvd: Any) -> Any:
    """Points TensorFlow at the ranks of kolo's job (rank 0 picks the ports and broadcasts
    them), gives each rank one intra-op thread, and creates the strategy (before any other
    TensorFlow op, as TensorFlow requires)."""
    import tensorflow as tf

    rank, size = hvd.rank(), hvd.size()
    ports = hvd.broadcast_object(
        [free_port() for _ in range(size)] if rank == 0 else None, root_rank=0
    )
    os.environ["TF_CONFIG"] = tf_config(ports, rank)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return tf.distribute.MultiWorkerMirroredStrategy()


def synthetic_batches(
    strategy: Any, rank: int, size: int, batch_size: int
) -> tuple[Iterator[Any], Iterator[Any]]:
    """One fixed batch per rank, repeated: as this rank's local batches, and as MWMS's global
    batches (``batch_size x size``, split among the replicas)."""
    import tensorflow as tf

    rng = np.random.default_rng(rank)
    x = rng.normal(size=(batch_size, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(batch_size,)).astype("int64")
    local = iter(tf.data.Dataset.from_tensors((x, y)).repeat())
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    global_batches = (
        tf.data.Dataset.from_tensors((np.concatenate([x] * size), np.concatenate([y] * size)))
        .repeat()
        .with_options(options)
    )
    return local, iter(strategy.experimental_distribute_dataset(global_batches))


def mwms_train_step(strategy: Any, model: Any, optimizer: Any, loss_fn: Any) -> Callable:
    """The ``tf.function`` step under ``strategy.run``: forward, loss (divided by the replicas,
    so Keras's all-reduced sum is the average), gradients, ``optimizer.apply``."""
    import tensorflow as tf

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
            scaled = loss / strategy.num_replicas_in_sync
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def step(batch):
        return strategy.run(replica_step, args=batch)

    return step


def slowest_seconds(
    hvd: Any, strategy: Any, step: Callable, batches: Iterator, steps: int
) -> float:
    """Seconds ``steps`` steps took on the slowest rank (all ranks start together)."""
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        result = step(next(batches))
    strategy.experimental_local_results(result)[0].numpy()  # wait for the last step
    elapsed = time.perf_counter() - start
    reduced = hvd.allreduce(np.array([elapsed]), op=hvd.Max, name="bench.elapsed")
    return float(np.asarray(reduced).reshape(-1)[0])


def interleaved_seconds(
    trainers: dict[str, Callable[[int], float]], warmup_steps: int, rounds: int, steps: int
) -> dict[str, list[float]]:
    """Each trainer's seconds for ``steps`` steps in each of ``rounds`` rounds, after
    ``warmup_steps`` of each (tracing, compiling); the order rotates every round."""
    for run in trainers.values():
        run(warmup_steps)
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    order = list(trainers)
    for _ in range(rounds):
        for name in order:
            seconds[name].append(trainers[name](steps))
        order = order[1:] + order[:1]
    return seconds
