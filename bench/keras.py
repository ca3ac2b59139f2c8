"""Keras 3 CPU training throughput: ``kolo.keras.DistributedOptimizer`` vs TensorFlow's
``tf.distribute.MultiWorkerMirroredStrategy`` (MWMS), interleaved in one job.

    kolorun -np 2 python bench/keras.py [--batch-size 64] [--steps 10] [--rounds 6]
        [--quick] [--json PATH]

Both train the same Keras model (a small CNN like bench/common.py's: two 3x3 convolutions with
pooling, two dense layers, 3x32x32 synthetic images, 10 classes, SGD with momentum, same initial
weights) with the TensorFlow backend, in the same processes, with the same ``tf.function`` train
step (forward, loss, ``tape.gradient``, ``optimizer.apply``): kolo's ``DistributedOptimizer``
averages the gradients inside ``apply`` (``tf.numpy_function`` into kolo's engine); the peer runs
the step with ``strategy.run`` under MWMS (TensorFlow's collective ops over gRPC; TF_CONFIG lists
the ranks on 127.0.0.1 ports rank 0 picks), fed global batches of ``batch size x ranks``. Not
``model.fit``: Keras 3's ``fit`` fails under MWMS (keras-team/keras#20585), while kolo's runs
(tests/test_keras.py). Each round times ``--steps`` steps of each, alternately (order flipped
every round); the figure is the median over rounds of samples/sec over all ranks (batch size x
ranks x steps / the slowest rank's time). Each rank runs TensorFlow with one intra-op thread.
Prints one line with both figures and the ratio kolo / MWMS (target: >= 1.0) and writes JSON to
bench/results/ (or ``--json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

# torch (for bench/common.py) and its triton must load before TensorFlow: see docs/keras.md.
import torch._dynamo  # noqa: F401
from _mwms import (
    build_smallcnn,
    interleaved_seconds,
    mwms_train_step,
    slowest_seconds,
    start_mwms,
    synthetic_batches,
)
from common import write_results

# This file is named keras.py and its folder comes first on sys.path: drop the folder, so that
# `import keras` (here and in kolo.keras) finds Keras.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

# isort: split
import kolo.keras as hvd  # noqa: E402 - after the sys.path fix above


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per trainer per round")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="--rounds 3 --steps 5")
    parser.add_argument("--json", type=Path, default=None, help="where rank 0 writes results")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = min(args.rounds, 3), min(args.steps, 5)

    os.environ["KERAS_BACKEND"] = "tensorflow"
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    strategy = start_mwms(hvd)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    initial = build_smallcnn(keras).get_weights()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    kolo_model = build_smallcnn(keras)
    kolo_model.set_weights(initial)
    kolo_optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    with strategy.scope():
        mwms_model = build_smallcnn(keras)
        mwms_model.set_weights(initial)
        mwms_optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    local, distributed = synthetic_batches(strategy, rank, size, args.batch_size)

    # The same train step for both (forward, loss, gradients, optimizer.apply), compiled with
    # tf.function: kolo's DistributedOptimizer averages the gradients inside apply.
    @tf.function
    def kolo_step(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, kolo_model(xb, training=True))
        grads = tape.gradient(loss, kolo_model.trainable_variables)
        kolo_optimizer.apply(grads, kolo_model.trainable_variables)
        return loss

    mwms_step = mwms_train_step(strategy, mwms_model, mwms_optimizer, loss_fn)
    seconds = interleaved_seconds(
        {
            "kolo": lambda steps: slowest_seconds(hvd, strategy, kolo_step, local, steps),
            "mwms": lambda steps: slowest_seconds(hvd, strategy, mwms_step, distributed, steps),
        },
        args.warmup_steps,
        args.rounds,
        args.steps,
    )
    row = {
        name: args.batch_size * size * args.steps / statistics.median(values)
        for name, values in seconds.items()
    }
    ratio = row["kolo"] / row["mwms"]
    if rank == 0:
        print(
            f"keras smallcnn batch {args.batch_size}x{size} (tensorflow {tf.__version__}, keras "
            f"{keras.__version__}): kolo {row['kolo']:8.1f} samples/s | "
            f"MultiWorkerMirroredStrategy {row['mwms']:8.1f} samples/s | ratio {ratio:.2f}x",
            flush=True,
        )
        write_results(
            "keras",
            {
                "ranks": size,
                "model": "smallcnn (keras)",
                "tensorflow_version": tf.__version__,
                "keras_version": keras.__version__,
                "batch_size_per_rank": args.batch_size,
                "steps_per_round": args.steps,
                "train_step": "tf.function: forward, loss, tape.gradient, optimizer.apply",
                "seconds_per_round": seconds,
                "median_samples_per_sec": row,
                "ratio_kolo_over_mwms": ratio,
            },
            args.json,
        )


if __name__ == "__main__":
    main()
