"""Data-parallel Keras 3 training with kolo's Horovod-compatible API (``kolo.keras``).

Uses scikit-learn's bundled ``load_digits`` data (no download). Each rank runs Keras's own
``model.fit`` on its shard of the training set; ``hvd.DistributedOptimizer`` averages the
gradients over the ranks inside the compiled train step, ``BroadcastGlobalVariablesCallback``
starts every rank from rank 0's weights (each rank initialises differently on purpose), and
``MetricAverageCallback`` logs metrics averaged over the ranks. Rank 0 reports the test
accuracy and every rank prints a checksum of its weights (they match).

Run it with 2 local processes (TensorFlow backend; ``KERAS_BACKEND=torch`` for torch)::

    kolorun -np 2 python examples/keras_digits.py
"""

from __future__ import annotations

import hashlib

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import kolo.keras as hvd

EPOCHS = 20
BATCH_SIZE = 32
LEARNING_RATE = 0.05


def load_shard() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """This rank's share of the training data (the same number of rows on every rank, so
    every rank runs the same number of steps), and the whole test set."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    rows = len(x_train) // hvd.size()
    start = hvd.rank() * rows
    return x_train[start : start + rows], y_train[start : start + rows], x_test, y_test


def weights_checksum(model: keras.Model) -> str:
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.asarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the callback aligns them
    x_train, y_train, x_test, y_test = load_shard()

    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)]
    )
    # Horovod's recipe: scale the learning rate by the number of ranks.
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(LEARNING_RATE * hvd.size(), momentum=0.9)
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(
        x_train,
        y_train,
        batch_size=BATCH_SIZE,
        epochs=EPOCHS,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
            hvd.callbacks.LearningRateWarmupCallback(LEARNING_RATE * hvd.size(), warmup_epochs=2),
        ],
        verbose=2 if hvd.rank() == 0 else 0,
    )
    if hvd.rank() == 0:
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        print(
            f"final train loss {history.history['loss'][-1]:.4f} (mean over ranks), "
            f"test accuracy {accuracy:.4f}",
            flush=True,
        )
    print(f"rank {hvd.rank()}: weights checksum {weights_checksum(model)}", flush=True)


if __name__ == "__main__":
    main()
