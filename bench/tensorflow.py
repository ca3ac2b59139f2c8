"""TensorFlow 2 custom-loop CPU training throughput: ``kolo.tensorflow.DistributedGradientTape``
vs TensorFlow's ``tf.distribute.MultiWorkerMirroredStrategy`` (MWMS), interleaved in one job,
with what the crossing into kolo's engine costs per step.

    kolorun -np 2 python bench/tensorflow.py [--batch-size 64] [--steps 10] [--rounds 6]
        [--quick] [--json PATH]

All three trainers run the same small CNN as bench/keras.py (two 3x3 convolutions with
pooling, two dense layers, 3x32x32 synthetic images, 10 classes, SGD with momentum, same
initial weights) in the same processes, each with a ``tf.function`` train step:

- ``kolo``: Horovod's TensorFlow 2 shape: ``hvd.DistributedGradientTape(tape).gradient(...)``
  (every gradient in ONE ``tf.numpy_function`` node into kolo's engine), then
  ``optimizer.apply``;
- ``mwms``: the step under ``strategy.run`` (TensorFlow's collective ops over gRPC; TF_CONFIG
  lists the ranks on 127.0.0.1 ports rank 0 picks), fed global batches of batch size x ranks;
- ``local``: the same step without any communication (each rank alone), the baseline that
  prices the communication: ``(step time - local step time)`` per step, in milliseconds.

Each round times ``--steps`` steps of each, in an order that rotates every round; a figure is
the median over rounds of samples/sec over all ranks (batch size x ranks x steps / the slowest
rank's time). Each rank runs TensorFlow with one intra-op thread. Prints one line with the
figures, the ratio kolo / MWMS (target: >= 1.2) and the per-step communication costs, and writes
JSON to bench/results/ (or ``--json``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _mwms import (
    build_smallcnn,
    interleaved_seconds,
    mwms_train_step,
    slowest_seconds,
    start_mwms,
    synthetic_batches,
)
from common import write_results

# This file is named tensorflow.py and its folder comes first on sys.path: drop the folder, so
# that `import tensorflow` (here and in kolo.tensorflow) finds TensorFlow.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.modules.pop("tensorflow", None)

# isort: split
import kolo.tensorflow as hvd  # noqa: E402 - after the sys.path fix above; loads triton first

# isort: split
import tensorflow as tf  # noqa: E402


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

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    strategy = start_mwms(hvd)

    tf.keras.utils.set_random_seed(0)
    initial = build_smallcnn(tf.keras).get_weights()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def fresh():
        model = build_smallcnn(tf.keras)
        model.set_weights(initial)
        return model, tf.keras.optimizers.SGD(0.01, momentum=0.9)

    kolo_model, kolo_optimizer = fresh()
    local_model, local_optimizer = fresh()
    with strategy.scope():
        mwms_model, mwms_optimizer = fresh()
    local, distributed = synthetic_batches(strategy, rank, size, args.batch_size)

    @tf.function
    def kolo_step(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, kolo_model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, kolo_model.trainable_variables)
        kolo_optimizer.apply(grads, kolo_model.trainable_variables)
        return loss

    @tf.function
    def local_step(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, local_model(xb, training=True))
        grads = tape.gradient(loss, local_model.trainable_variables)
        local_optimizer.apply(grads, local_model.trainable_variables)
        return loss

    mwms_step = mwms_train_step(strategy, mwms_model, mwms_optimizer, loss_fn)
    seconds = interleaved_seconds(
        {
            "kolo": lambda steps: slowest_seconds(hvd, strategy, kolo_step, local, steps),
            "mwms": lambda steps: slowest_seconds(hvd, strategy, mwms_step, distributed, steps),
            "local": lambda steps: slowest_seconds(hvd, strategy, local_step, local, steps),
        },
        args.warmup_steps,
        args.rounds,
        args.steps,
    )

    step_ms = {name: 1000 * statistics.median(v) / args.steps for name, v in seconds.items()}
    throughput = {name: args.batch_size * size / (ms / 1000) for name, ms in step_ms.items()}
    ratio = throughput["kolo"] / throughput["mwms"]
    cost_ms = {name: step_ms[name] - step_ms["local"] for name in ("kolo", "mwms")}
    if rank == 0:
        print(
            f"tensorflow smallcnn batch {args.batch_size}x{size} (tensorflow {tf.__version__}): "
            f"kolo {throughput['kolo']:8.1f} samples/s | MultiWorkerMirroredStrategy "
            f"{throughput['mwms']:8.1f} samples/s | ratio {ratio:.2f}x | communication per "
            f"step: kolo {cost_ms['kolo']:.2f} ms, MWMS {cost_ms['mwms']:.2f} ms (local step "
            f"{step_ms['local']:.2f} ms)",
            flush=True,
        )
        write_results(
            "tensorflow",
            {
                "ranks": size,
                "model": "smallcnn (tf.keras)",
                "tensorflow_version": tf.__version__,
                "batch_size_per_rank": args.batch_size,
                "steps_per_round": args.steps,
                "train_step": "tf.function: forward, loss, tape.gradient, optimizer.apply",
                "seconds_per_round": seconds,
                "median_step_ms": step_ms,
                "samples_per_sec": throughput,
                "ratio_kolo_over_mwms": ratio,
                "communication_ms_per_step": cost_ms,
            },
            args.json,
        )


if __name__ == "__main__":
    main()
