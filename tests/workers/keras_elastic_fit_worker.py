"""One rank of an elastic Keras ``model.fit`` (Horovod's tensorflow2_keras_mnist_elastic.py, on
small data): ``KerasState`` + the three state callbacks, ``@hvd.elastic.run`` around ``fit``.
tests/test_elastic_frameworks.py starts 3 of these under an elastic driver and SIGKILLs one
mid-fit.

Each rank trains on its shard ``x[rank::size]`` (re-split when the size changes), so the ranks
only keep equal weights while the gradients are averaged. It prints ``batch <epoch> <batch>
<size>`` after every batch (sleeping ``SLOW`` seconds, so a kill lands mid-epoch) and, at the
end, ``result <json>``: the epochs done, the optimizer's step count, each round's starting
epoch and size, and the final weights.

With ``HOLD_ALONE=1``, a rank alone in the job waits at the end of its epoch (just after the
commit, up to 120 s) until the rank being added registered and the interrupt came: the driver
announces a new rank only then, and a one-rank fit would otherwise end before it starts.
"""

from __future__ import annotations

import json
import os
import time

import keras
import numpy as np

import kolo.keras as hvd

EPOCHS = 4
STEPS = 3
BATCH = 4
SLOW = 0.1
HOLD_ALONE = os.environ.get("HOLD_ALONE") == "1"
HOLD_FOR = 120.0


def main() -> None:
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different weights on each rank until the sync
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(72, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    rounds = []

    class Progress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            print(f"batch {state.epoch} {batch} {hvd.size()}", flush=True)
            time.sleep(SLOW)
            if HOLD_ALONE and hvd.size() == 1 and batch == STEPS - 1:
                # After this batch's commit; a global op lets the check see the driver's news.
                deadline = time.monotonic() + HOLD_FOR
                while time.monotonic() < deadline:
                    hvd.barrier()
                    state.check_host_updates()
                    time.sleep(0.02)

    callbacks = [
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        # Commits at each epoch's last batch and end only, so the steps an interrupted epoch
        # made are all undone by the restore (the step count below is then exact).
        hvd.elastic.CommitStateCallback(state, batches_per_commit=STEPS),
        Progress(),
    ]

    @hvd.elastic.run
    def train(state):
        rounds.append([state.epoch, hvd.size()])
        shard = slice(hvd.rank(), None, hvd.size())
        model.fit(
            x[shard],
            y[shard],
            batch_size=BATCH,
            epochs=EPOCHS - state.epoch,
            steps_per_epoch=STEPS,
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
        return state.epoch

    epochs = train(state)
    # No rank leaves while another is still in its last commit (a rank that left ends the round).
    hvd.barrier()
    result = dict(
        rank=hvd.rank(),
        size=hvd.size(),
        epochs=epochs,
        steps=int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        rounds=rounds,
        weights=[w.tolist() for w in model.get_weights()],
    )
    print("result " + json.dumps(result), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
