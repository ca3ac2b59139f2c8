"""kolo.keras scenarios for tests/test_keras.py, run on 2 ranks under kolorun.

Usage: ``KERAS_BACKEND=tensorflow|torch kolorun -np 2 python keras_worker.py SCENARIO...``.
Every rank runs the scenarios in order, checks its result against a single-process reference
computed in the same process, and prints ``rank R: <scenario> ok``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import keras
import numpy as np

import kolo.keras as hvd
from kolo.exceptions import ConfigError, InvalidValueError, NotSupportedError

STEPS = 6  # optimizer updates per epoch
LOCAL = 8  # rows per rank per step
FEATURES = 5
CLASSES = 3


def data(steps: int = STEPS, rows: int = LOCAL) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(steps * rows * 2, FEATURES)).astype("float32")
    y = (x[:, 0] + 2 * x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    return x, y


def shard(x: np.ndarray, rows: int) -> np.ndarray:
    """This rank's rows when each global batch of ``2 * rows`` is split in two halves."""
    r = hvd.rank()
    return np.concatenate(
        [x[i + r * rows : i + (r + 1) * rows] for i in range(0, len(x), 2 * rows)]
    )


def dense_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )


def embedding_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((2,), dtype="int32"),
            keras.layers.Embedding(20, 4),
            keras.layers.Flatten(),
            keras.layers.Dense(CLASSES),
        ]
    )


def loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(keras.ops.convert_to_numpy(w)) for w in model.weights]


def assert_close(got: list[np.ndarray], want: list[np.ndarray], what: str, tol=2e-5) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        if not np.allclose(g, w, rtol=tol, atol=tol):
            raise AssertionError(f"{what}: weight {i} differs by {np.abs(g - w).max()}")


def assert_far(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    diff = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    assert diff > 1e-3, f"{what}: expected a difference, max diff {diff}"


def same_on_every_rank(values: list[np.ndarray], what: str) -> None:
    theirs = hvd.broadcast_object(values, root_rank=0)
    assert_close(values, theirs, f"{what} (rank {hvd.rank()} vs rank 0)", tol=0)


class Capture(keras.callbacks.Callback):
    """Copies the epoch logs as this rank computed them (listed before MetricAverage)."""

    def __init__(self) -> None:
        super().__init__()
        self.local: list[dict] = []

    def on_epoch_end(self, epoch, logs=None):
        self.local.append(dict(logs or {}))


def scenario_fit() -> None:
    """2 ranks x 8 rows == 1 process x 16 rows; initial weights come from rank 0 (each rank
    initialises differently); metrics are averaged over the ranks."""
    x, y = data()
    model = dense_model(seed=100 + hvd.rank())
    initial = weights(model)
    rank0_initial = hvd.broadcast_object(initial, root_rank=0)
    if hvd.rank() == 1:
        assert_far(initial, rank0_initial, "ranks start from different weights")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=opt, loss=loss(), metrics=["accuracy"])
    capture = Capture()
    history = model.fit(
        shard(x, LOCAL),
        shard(y, LOCAL),
        batch_size=LOCAL,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            capture,
            hvd.callbacks.MetricAverageCallback(),
        ],
    )
    got = weights(model)
    same_on_every_rank(got, "trained weights")

    reference = dense_model(seed=100)
    assert_close(weights(reference), rank0_initial, "reference starts from rank 0's weights", 0)
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss())
    reference.fit(x, y, batch_size=2 * LOCAL, epochs=2, shuffle=False, verbose=0)
    assert_close(got, weights(reference), "2 ranks vs one process on the double batch")

    alone = dense_model(seed=100)
    alone.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss())
    alone.fit(
        shard(x, LOCAL), shard(y, LOCAL), batch_size=LOCAL, epochs=2, shuffle=False, verbose=0
    )
    assert_far(got, weights(alone), "training on the local shard alone")

    every_local = hvd.allgather_object([c["loss"] for c in capture.local])
    assert every_local[0] != every_local[1], "ranks should see different local losses"
    mean = np.mean(np.array(every_local), axis=0)
    assert np.allclose(history.history["loss"], mean, rtol=1e-6), (history.history, mean)


def scenario_accumulate() -> None:
    """backward_passes_per_step=2 with averaging: 2 ranks x 2 passes x 4 rows == 16 rows."""
    rows = 4
    x, y = data(steps=2 * STEPS, rows=rows)
    model = dense_model(seed=5)
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1), backward_passes_per_step=2, average_aggregated_gradients=True
    )
    model.compile(optimizer=opt, loss=loss())
    # Rank r's rows of update k: the two passes' halves of rows [16k, 16k + 16).
    xr = np.concatenate([shard(x[i : i + 4 * rows], rows) for i in range(0, len(x), 4 * rows)])
    yr = np.concatenate([shard(y[i : i + 4 * rows], rows) for i in range(0, len(y), 4 * rows)])
    model.fit(xr, yr, batch_size=rows, epochs=1, shuffle=False, verbose=0)
    assert int(keras.ops.convert_to_numpy(opt.iterations)) == STEPS, opt.iterations

    reference = dense_model(seed=5)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss())
    reference.fit(x, y, batch_size=4 * rows, epochs=1, shuffle=False, verbose=0)
    assert_close(weights(model), weights(reference), "accumulated 2 passes vs one process")


def scenario_groups() -> None:
    """groups=2 and groups=[[kernel of the first layer]] reduce in several fused calls and
    still equal one process on the double batch; gradient_predivide_factor too."""
    x, y = data()
    reference = dense_model(seed=9)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss())
    reference.fit(x, y, batch_size=2 * LOCAL, shuffle=False, verbose=0)
    for options in (
        {"groups": 2},
        {"groups": "first kernel"},
        {"gradient_predivide_factor": 2.0},
    ):
        model = dense_model(seed=9)
        if options.get("groups") == "first kernel":
            options = {"groups": [[model.layers[0].kernel]]}
        model.compile(
            optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), **options), loss=loss()
        )
        model.fit(shard(x, LOCAL), shard(y, LOCAL), batch_size=LOCAL, shuffle=False, verbose=0)
        assert_close(weights(model), weights(reference), f"DistributedOptimizer({options})")


def scenario_sparse() -> None:
    """Embedding gradients (tf.IndexedSlices under TensorFlow) gathered, or reduced densely."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 20, size=(STEPS * 2 * LOCAL, 2)).astype("int32")
    y = (x[:, 0] % CLASSES).astype("int64")
    for sparse_as_dense in (False, True):
        model = embedding_model(seed=11)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.5), sparse_as_dense=sparse_as_dense)
        model.compile(optimizer=opt, loss=loss())
        model.fit(shard(x, LOCAL), shard(y, LOCAL), batch_size=LOCAL, shuffle=False, verbose=0)
        reference = embedding_model(seed=11)
        reference.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss())
        reference.fit(x, y, batch_size=2 * LOCAL, shuffle=False, verbose=0)
        assert_close(weights(model), weights(reference), f"embedding, dense={sparse_as_dense}")


def scenario_ops() -> None:
    """allreduce / allgather / broadcast eagerly and (TensorFlow) inside tf.function."""
    r = hvd.rank()
    value = keras.ops.convert_to_tensor(np.full((2, 3), r + 1.0, dtype="float32"))
    total = keras.ops.convert_to_numpy(hvd.allreduce(value, op=hvd.Sum, name="ops.sum"))
    assert np.allclose(total, 3.0), total
    mean = keras.ops.convert_to_numpy(hvd.allreduce(value, name="ops.mean"))
    assert np.allclose(mean, 1.5), mean
    scalar = hvd.allreduce(keras.ops.convert_to_tensor(float(r)), op=hvd.Sum, name="ops.scalar")
    assert tuple(scalar.shape) == () and float(keras.ops.convert_to_numpy(scalar)) == 1.0, scalar
    rows = np.full((r + 1, 2), r, dtype="int64")
    gathered = keras.ops.convert_to_numpy(hvd.allgather(rows, name="ops.gather"))
    assert gathered.tolist() == [[0, 0], [1, 1], [1, 1]], gathered
    root = keras.ops.convert_to_numpy(hvd.broadcast(value, root_rank=1, name="ops.bcast"))
    assert np.allclose(root, 2.0), root
    half = keras.ops.convert_to_numpy(
        hvd.allreduce(value, op=hvd.Sum, compression=hvd.Compression.fp16, name="ops.fp16")
    )
    assert half.dtype == np.float32 and np.allclose(half, 3.0), half
    # Adasum of [1, 0] and [1, 1]: a.b = 1, |a|^2 = 1, |b|^2 = 2, so 0.5 a + 0.75 b.
    pair = np.array([1.0, 0.0] if r == 0 else [1.0, 1.0], dtype="float32")
    ada = keras.ops.convert_to_numpy(hvd.allreduce(pair, op=hvd.Adasum, name="ops.adasum"))
    assert np.allclose(ada, [1.25, 0.75]), ada
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(t):
            return (
                hvd.allreduce(t, op=hvd.Sum, name="graph.sum"),
                hvd.allgather(t),
                hvd.allreduce(t + 1.0, op=hvd.Adasum, name="graph.adasum"),
            )

        for _ in range(2):
            s, g, a = step(tf.constant([float(r)]))
            assert s.numpy().tolist() == [1.0] and g.numpy().tolist() == [0.0, 1.0], (s, g)
            # [1] and [2] are parallel: Adasum averages them.
            assert a.numpy().tolist() == [1.5], a
    var = keras.Variable(np.full(4, float(r), dtype="float32"))
    hvd.broadcast_variables([var], root_rank=1)
    assert np.allclose(keras.ops.convert_to_numpy(var), 1.0)


def rank_values(r: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Rank ``r``'s reducescatter input: every rank can compute every rank's."""
    rng = np.random.default_rng(100 + r)
    return (rng.normal(size=shape) * 4).astype(dtype)


def scatter_reference(shape: tuple[int, ...], dtype: str, reduce) -> np.ndarray:
    """This rank's part of the reduction of both ranks' inputs (the first rows % 2 ranks get
    one row more, as Horovod)."""
    full = reduce(np.stack([rank_values(r, shape, dtype) for r in range(hvd.size())]))
    full = full.astype(dtype)  # (NumPy sums int32 as int64)
    rows, n, me = shape[0], hvd.size(), hvd.rank()
    start = me * (rows // n) + min(me, rows % n)
    return full[start : start + rows // n + (1 if me < rows % n else 0)]


def scenario_reducescatter() -> None:
    """reducescatter against NumPy: Sum, Average (the default), Max, Min on float32/float64/
    int32, uneven rows, eagerly and (TensorFlow) inside tf.function and a compiled fit."""
    r = hvd.rank()
    cases = [
        ((5, 3), "float32", hvd.Sum, lambda a: a.sum(0)),
        ((4, 2, 2), "float64", None, lambda a: a.mean(0)),
        ((3,), "int32", hvd.Sum, lambda a: a.sum(0)),
        ((6, 1), "float32", hvd.Max, lambda a: a.max(0)),
        ((7, 2), "float32", hvd.Min, lambda a: a.min(0)),
    ]
    for i, (shape, dtype, op, reduce) in enumerate(cases):
        value = keras.ops.convert_to_tensor(rank_values(r, shape, dtype))
        kwargs = {} if op is None else {"op": op}
        got = hvd.reducescatter(value, name=f"rs.{i}", **kwargs)
        want = scatter_reference(shape, dtype, reduce)
        got = keras.ops.convert_to_numpy(got)
        assert got.dtype == want.dtype and got.shape == want.shape, (i, got.shape, want.shape)
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6), (i, got, want)
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    @tf.function
    def step(t):
        return hvd.reducescatter(t, op=hvd.Sum, name="graph.rs"), hvd.reducescatter(t * 2.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def unknown_rows(t):
        return hvd.reducescatter(t, op=hvd.Sum, name="graph.rs.unknown")

    x = rank_values(r, (5, 3), "float32")
    want = scatter_reference((5, 3), "float32", lambda a: a.sum(0))
    for _ in range(2):
        total, mean2 = step(tf.constant(x))
        assert total.shape == want.shape, (total.shape, want.shape)  # static, from the graph
        assert np.allclose(total.numpy(), want, atol=1e-5), (total, want)
        assert np.allclose(mean2.numpy(), want, atol=1e-5), (mean2, want)  # 2x average == sum
        got = unknown_rows(tf.constant(x))
        assert np.allclose(got.numpy(), want, atol=1e-5), (got, want)

    class ScatterSum(keras.layers.Layer):
        """Adds the column sums of the rows this rank gets from a reducescatter of a constant
        (run inside the train step model.fit compiles)."""

        def call(self, inputs):
            part = hvd.reducescatter(tf.constant(x), op=hvd.Sum, name="fit.rs")
            return inputs + tf.reduce_sum(part)

    model = keras.Sequential([keras.Input((1,)), ScatterSum()])
    model.compile(optimizer="sgd", loss="mse")
    out = model.predict(np.zeros((2, 1), "float32"), verbose=0)
    assert np.allclose(out, want.sum(), atol=1e-4), (out, want.sum())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The model does not have any trainable weights")
        history = model.fit(np.zeros((4, 1)), np.zeros((4, 1)), batch_size=2, verbose=0)
    assert np.isclose(history.history["loss"][0], want.sum() ** 2, rtol=1e-4), history.history


def linear_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4), keras.layers.Dense(CLASSES)]
    )


def partial_reference(
    inits: list[list[np.ndarray]],
    xs: list[np.ndarray],
    ys: list[np.ndarray],
    lr: float,
    scale: bool,
    passes: int = 1,
) -> list[list[np.ndarray]]:
    """Every rank's weights after SGD steps with the first Dense shared (rank 0's initial
    values, its gradient averaged over the ranks) and the second local (each rank's initial
    values and own gradient, / size when ``scale``), by hand in NumPy:
    out = (x W1 + b1) W2 + b2, MSE over all elements. Each update applies the sum of
    ``passes`` batches' gradients (Horovod's backward_passes_per_step default)."""
    n = hvd.size()
    w1, b1 = inits[0][0].astype("float64"), inits[0][1].astype("float64")
    local = [[inits[r][2].astype("float64"), inits[r][3].astype("float64")] for r in range(n)]
    factor = 1.0 / n if scale else 1.0
    for update in range(len(xs[0]) // (LOCAL * passes)):
        g_shared = [np.zeros_like(w1), np.zeros_like(b1)]
        g_local = [[np.zeros_like(w) for w in local[r]] for r in range(n)]
        for r, step in ((r, update * passes + p) for r in range(n) for p in range(passes)):
            x = xs[r][step * LOCAL : (step + 1) * LOCAL].astype("float64")
            y = ys[r][step * LOCAL : (step + 1) * LOCAL].astype("float64")
            w2, b2 = local[r]
            h = x @ w1 + b1
            d = 2.0 * (h @ w2 + b2 - y) / y.size
            dh = d @ w2.T
            g_shared[0] += x.T @ dh / n
            g_shared[1] += dh.sum(0) / n
            g_local[r][0] += h.T @ d * factor
            g_local[r][1] += d.sum(0) * factor
        w1, b1 = w1 - lr * g_shared[0], b1 - lr * g_shared[1]
        for r in range(n):
            local[r] = [local[r][0] - lr * g_local[r][0], local[r][1] - lr * g_local[r][1]]
    return [[w1, b1, *local[r]] for r in range(n)]


def scenario_partial() -> None:
    """PartialDistributedOptimizer(local_layers=[head]): the first Dense is averaged over the
    ranks, the head trains on each rank's own data; both equal a NumPy reference (with and
    without scale_local_gradients, and with backward_passes_per_step=2), the shared weights
    are identical on every rank and the head's differ. Ranks initialise differently;
    BroadcastGlobalVariablesCallback(0, local_variables=head weights) gives them rank 0's
    shared weights and keeps their heads."""
    rng = np.random.default_rng(21)
    xs = [rng.normal(size=(4 * LOCAL, FEATURES)).astype("float32") for _ in range(hvd.size())]
    ys = [rng.normal(size=(4 * LOCAL, CLASSES)).astype("float32") for _ in range(hvd.size())]
    lr = 0.1
    inits = [weights(linear_model(seed=5 + r)) for r in range(hvd.size())]
    for scale, passes in ((True, 1), (False, 1), (True, 2)):
        model = linear_model(seed=5 + hvd.rank())
        head = model.layers[-1]
        opt = hvd.PartialDistributedOptimizer(
            keras.optimizers.SGD(lr),
            local_layers=head,
            scale_local_gradients=scale,
            backward_passes_per_step=passes,
            name=f"partial.{scale}.{passes}",
        )
        model.compile(optimizer=opt, loss="mse")
        r = hvd.rank()
        callback = hvd.callbacks.BroadcastGlobalVariablesCallback(
            0, local_variables=head.trainable_weights
        )
        model.fit(xs[r], ys[r], batch_size=LOCAL, shuffle=False, verbose=0, callbacks=[callback])
        got = weights(model)
        want = partial_reference(inits, xs, ys, lr, scale, passes)
        what = f"partial, scale_local_gradients={scale}, backward_passes_per_step={passes}"
        assert_close(got, want[r], what, tol=1e-5)
        same_on_every_rank(got[:2], "shared Dense")
        head0 = hvd.broadcast_object(got[2:], root_rank=0)
        if r != 0:
            assert_far(got[2:], head0, "local head vs rank 0's")
        other = partial_reference(inits, xs, ys, lr, not scale, passes)
        assert_far(want[r][2:], other[r][2:], "scale")


def scenario_errors() -> None:
    def expect(error, fn, text):
        try:
            fn()
        except error as exc:
            assert type(exc) is error and text in str(exc), (type(exc), exc)
            return
        raise AssertionError(f"expected {error.__name__} ({text})")

    sgd = keras.optimizers.SGD(0.1)
    expect(InvalidValueError, lambda: hvd.DistributedOptimizer(object()), "Keras 3 optimizer")
    expect(
        InvalidValueError,
        lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum, average_aggregated_gradients=True),
        "average_aggregated_gradients",
    )
    expect(
        InvalidValueError,
        lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0),
        "backward_passes_per_step",
    )
    expect(
        InvalidValueError,
        lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0),
        "gradient_predivide_factor",
    )
    expect(
        InvalidValueError,
        lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd)),
        "already",
    )
    expect(
        InvalidValueError,
        lambda: hvd.PartialDistributedOptimizer(sgd, op=hvd.Max),
        "Average or hvd.Sum",
    )
    expect(
        InvalidValueError,
        lambda: hvd.PartialDistributedOptimizer(sgd, local_layers=[object()]),
        "keras.layers.Layer",
    )
    expect(
        InvalidValueError,
        lambda: hvd.PartialDistributedOptimizer(sgd, local_layers=keras.layers.Dense(2)),
        "not built",
    )
    expect(
        InvalidValueError,
        lambda: hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[object()]),
        "keras.Variable",
    )
    expect(NotSupportedError, lambda: hvd.load_model("x.keras", legacy_opts=True), "legacy")
    # Keras 3 has no global variable collections: a typed error naming the alternatives.
    expect(NotSupportedError, lambda: hvd.broadcast_global_variables(0), "broadcast_variables(")
    expect(
        NotSupportedError,
        lambda: hvd.broadcast_global_variables(1),
        "BroadcastGlobalVariablesCallback(1)",
    )
    expect(
        InvalidValueError, lambda: hvd.callbacks.LearningRateScheduleCallback(0, 1.0), "initial_lr"
    )
    model = dense_model(seed=1)
    model.compile(optimizer="sgd", loss=loss())
    expect(
        ConfigError,
        lambda: model.fit(
            np.zeros((4, FEATURES)),
            np.zeros(4),
            verbose=0,
            callbacks=[hvd.callbacks.BestModelCheckpoint()],
        ),
        "filepath",
    )


def scenario_warmup() -> None:
    """The warmup ramps from initial_lr / size to initial_lr, then a staircase schedule halves
    it from epoch 3."""
    x, y = data()
    model = dense_model(seed=2)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.2, momentum=0.9))
    model.compile(optimizer=opt, loss=loss())
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    model.fit(
        shard(x, LOCAL),
        shard(y, LOCAL),
        batch_size=LOCAL,
        epochs=4,
        shuffle=False,
        verbose=0,
        callbacks=[
            hvd.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=2),
            hvd.callbacks.LearningRateScheduleCallback(0.2, lambda epoch: 0.5, start_epoch=3),
            Record(),
        ],
    )
    expected = [0.2 / 2 * ((e + b / STEPS) * 1 / 2 + 1) for e in range(2) for b in range(STEPS)]
    assert np.allclose(seen[: 2 * STEPS], expected), (seen, expected)
    assert np.allclose(seen[2 * STEPS : 3 * STEPS], 0.2), seen
    assert np.allclose(seen[3 * STEPS :], 0.1), seen
    same_on_every_rank(weights(model), "weights after the schedule")
    # Momentum correction: a rate change 0.1 -> 0.2 doubles SGD's momentum buffers.
    before = [np.array(keras.ops.convert_to_numpy(m)) for m in opt.momentums]
    callback = hvd.callbacks.LearningRateScheduleCallback(0.2, 1.0)
    callback.set_model(model)
    callback.on_epoch_begin(0)
    after = [np.array(keras.ops.convert_to_numpy(m)) for m in opt.momentums]
    assert_close(after, [2 * b for b in before], "momentum buffers after the rate doubled")
    assert_far(after, before, "momentum buffers")


def scenario_checkpoint() -> None:
    """BestModelCheckpoint writes on rank 0 only; load_model restores a DistributedOptimizer."""
    x, y = data()
    folder = hvd.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None)
    path = os.path.join(folder, f"best-{keras.backend.backend()}.keras")
    model = dense_model(seed=3)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=loss())
    model.fit(
        shard(x, LOCAL),
        shard(y, LOCAL),
        batch_size=LOCAL,
        epochs=2,
        verbose=0,
        shuffle=False,
        validation_data=(x[:16], y[:16]),
        callbacks=[
            hvd.callbacks.MetricAverageCallback(),
            hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath=path),
        ],
    )
    hvd.barrier()
    assert os.path.exists(path), path
    loaded = hvd.load_model(path)
    assert hvd.optimizer.is_distributed(loaded.optimizer), type(loaded.optimizer).__mro__
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    restored = int(keras.ops.convert_to_numpy(loaded.optimizer.iterations))
    assert restored in (STEPS, 2 * STEPS), f"optimizer state not restored ({restored} steps)"
    plain = keras.saving.load_model(path)
    assert not hvd.optimizer.is_distributed(plain.optimizer)
    loaded.fit(shard(x, LOCAL), shard(y, LOCAL), batch_size=LOCAL, verbose=0, shuffle=False)
    same_on_every_rank(weights(loaded), "weights after resuming from the checkpoint")


SCENARIOS = {
    "fit": scenario_fit,
    "accumulate": scenario_accumulate,
    "groups": scenario_groups,
    "sparse": scenario_sparse,
    "ops": scenario_ops,
    "errors": scenario_errors,
    "warmup": scenario_warmup,
    "checkpoint": scenario_checkpoint,
    "reducescatter": scenario_reducescatter,
    "partial": scenario_partial,
}


def main() -> None:
    hvd.init()
    for name in sys.argv[1:]:
        SCENARIOS[name]()
        print(f"rank {hvd.rank()}: {name} ok", flush=True)


if __name__ == "__main__":
    main()
