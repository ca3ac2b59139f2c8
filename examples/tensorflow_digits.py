"""Data-parallel TensorFlow 2 training with kolo's Horovod-compatible API (``kolo.tensorflow``),
in the shape of Horovod's ``examples/tensorflow2/tensorflow2_mnist.py``.

Uses scikit-learn's bundled ``load_digits`` data (no download). A custom training loop: the
``tf.function`` train step wraps its ``tf.GradientTape`` in ``hvd.DistributedGradientTape``
(which averages the gradients over the ranks in one crossing per step), and after the first
step ``hvd.broadcast_variables`` gives every rank rank 0's model and optimizer state (each
rank initialises differently on purpose). Rank 0 reports the test accuracy and every rank
prints a checksum of its weights (they match).

Run it with 2 local processes::

    kolorun -np 2 python examples/tensorflow_digits.py
"""

from __future__ import annotations

import hashlib

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import kolo.tensorflow as hvd

# isort: split
import tensorflow as tf

STEPS = 400  # global steps; each rank runs STEPS // size of them on its own shard
BATCH_SIZE = 32
LEARNING_RATE = 0.002


def load_shard() -> tuple[tf.data.Dataset, np.ndarray, np.ndarray]:
    """This rank's shard of the training set as a repeating, shuffled dataset, and the whole
    test set."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    rows = len(x_train) // hvd.size()
    start = hvd.rank() * rows
    dataset = tf.data.Dataset.from_tensor_slices(
        (x_train[start : start + rows], y_train[start : start + rows].astype(np.int64))
    )
    dataset = dataset.repeat().shuffle(1000, seed=hvd.rank()).batch(BATCH_SIZE)
    return dataset, x_test, y_test


def weights_checksum(model: tf.keras.Model) -> str:
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.asarray(weight).tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    # Horovod: initialize Horovod.
    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast aligns them
    dataset, x_test, y_test = load_shard()

    model = tf.keras.Sequential(
        [
            tf.keras.Input((64,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.1),
            tf.keras.layers.Dense(10),
        ]
    )
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Horovod: adjust the learning rate to the number of ranks.
    opt = tf.keras.optimizers.Adam(LEARNING_RATE * hvd.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss_value = loss(labels, logits)

        # Horovod: add Horovod's DistributedGradientTape.
        tape = hvd.DistributedGradientTape(tape)

        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes,
        # after the first step so that the optimizer's state exists.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)

        return loss_value

    # Horovod: adjust the number of steps to the number of ranks.
    for batch, (images, labels) in enumerate(dataset.take(STEPS // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)
        if batch % 50 == 0 and hvd.rank() == 0:
            print(f"Step #{batch}\tLoss: {float(loss_value):.6f}", flush=True)

    if hvd.rank() == 0:
        predictions = np.argmax(model(x_test, training=False), axis=1)
        print(f"test accuracy {float(np.mean(predictions == y_test)):.4f}", flush=True)
    print(f"rank {hvd.rank()}: weights checksum {weights_checksum(model)}", flush=True)


if __name__ == "__main__":
    main()
