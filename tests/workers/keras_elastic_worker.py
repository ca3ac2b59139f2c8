"""kolo.keras.elastic on 2 ranks: KerasState sync/commit/restore of the model and optimizer
variables, the state callbacks in model.fit, and hvd.elastic.run recovering from a collective
that fails inside the compiled train step. Prints ``rank R: keras elastic ok``."""

from __future__ import annotations

import keras
import numpy as np

import kolo.keras as hvd


def weights(variables) -> list[np.ndarray]:
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


class Probe(keras.layers.Layer):
    """An allreduce inside the compiled step; ``broken`` (read when the step is traced) makes
    the ranks disagree on its shape."""

    broken = False

    def call(self, x):
        n = 2 + hvd.rank() if self.broken else 2
        hvd.allreduce(keras.ops.ones((n,)), name="probe")
        return x


def check_recovery(rank: int, x: np.ndarray, y: np.ndarray) -> None:
    keras.utils.set_random_seed(rank)
    probe = Probe()
    model = keras.Sequential([keras.Input((3,)), probe, keras.layers.Dense(1)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0)
    attempts = []

    def fit_one_epoch() -> None:
        model.compile(optimizer=optimizer, loss="mse")  # traces the step again
        model.fit(
            x,
            y,
            batch_size=4,
            epochs=1,
            steps_per_epoch=2,
            shuffle=False,
            verbose=0,
            callbacks=[
                hvd.elastic.UpdateEpochStateCallback(state),
                hvd.elastic.CommitStateCallback(state, batches_per_commit=100),
            ],
        )

    @hvd.elastic.run
    def train(state):
        attempts.append(state.epoch)
        while state.epoch < 3:
            probe.broken = len(attempts) == 1 and state.epoch == 1
            fit_one_epoch()
        return weights(model.variables)

    initial = None

    def remember_initial() -> None:
        nonlocal initial
        if initial is None:
            initial = (weights(model.variables), weights(optimizer.variables))

    original_sync = state.sync
    state.sync = lambda: (original_sync(), remember_initial())  # the synced start, for reference
    final = train(state)
    assert attempts == [0, 1], f"rounds started at epochs {attempts}: expected 0, then 1"
    # An uninterrupted run from the same start gives the same weights.
    for var, value in zip(model.variables, initial[0]):
        var.assign(value)
    for var, value in zip(optimizer.variables, initial[1]):
        var.assign(value)
    probe.broken = False
    for _ in range(3):
        fit_one_epoch()
    assert equal(final, weights(model.variables)), (
        "the recovered fit differs from an uninterrupted one"
    )


def main() -> None:
    hvd.init()
    rank = hvd.rank()
    keras.utils.set_random_seed(rank)  # different weights on each rank until the sync
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 3)).astype("float32"), rng.normal(size=(24, 1)).astype("float32")
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.sync()
    synced = weights(model.variables)
    everyone = hvd.allgather_object(synced)
    assert equal(everyone[0], everyone[1]), "sync did not give every rank rank 0's weights"

    # Train, commit, train on, restore: model and optimizer variables back to the commit.
    model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=2, verbose=0)
    state.commit()
    committed = weights(model.variables)
    committed_opt = weights(model.optimizer.variables)
    assert any(np.any(v != 0) for v in committed_opt), "no momentum to commit"
    model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=2, verbose=0)
    assert not equal(weights(model.variables), committed)
    state.restore()
    assert equal(weights(model.variables), committed), "restore: model variables"
    assert equal(weights(model.optimizer.variables), committed_opt), "restore: optimizer"

    # The callbacks: state.batch follows the batch (0 at the end of an epoch); state.epoch
    # counts on from where it was; every 4 batches and every epoch end commit (the last commit
    # is the final model).
    state.batch, state.epoch = 1, 4
    steps = []
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        steps_per_epoch=3,
        verbose=0,
        callbacks=[
            hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
            hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state),
            keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs: steps.append((b, state.batch))
            ),
        ],
    )
    assert steps == [(b, b) for b in (0, 1, 2, 0, 1, 2)], f"(batch, state.batch): {steps}"
    assert (state.epoch, state.batch) == (6, 0), (state.epoch, state.batch)
    final = weights(model.variables)
    state.restore()
    assert equal(weights(model.variables), final), "the epoch-end commit did not happen"
    check_recovery(rank, x, y)
    print(f"rank {rank}: keras elastic ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
