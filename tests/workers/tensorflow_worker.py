"""kolo.tensorflow scenarios for tests/test_tensorflow.py, run under kolorun on 2 or 3 ranks.

Usage: ``kolorun -np N python tensorflow_worker.py SCENARIO...``. Every rank runs the scenarios
in order, checks its results against NumPy references it computes itself (it knows every
rank's inputs), and prints ``rank R: <scenario> ok``. A check that fails raises, so the
scenario's line is missing and the launch fails.
"""

# The step functions close over their loop iteration's inputs and run within it.
# ruff: noqa: B023

from __future__ import annotations

import os
import sys
import warnings

import ml_dtypes
import numpy as np
import tensorflow as tf

import kolo.tensorflow as hvd
from kolo.exceptions import ConfigError, MismatchError, NotSupportedError

DTYPES = [
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
MODES = ("eager", "tf.function")
# A subset of the ranks, registered at init: ranks 0 and 2 of 3, rank 1 of 2, rank 0 of 1.
WORLD = int(os.environ["KOLO_SIZE"])
SUBSET_RANKS = [0, WORLD - 1] if WORLD > 2 else [WORLD - 1]
# One rank: the subset is the whole job (a set cannot be registered twice).
SUBSET = hvd.ProcessSet(SUBSET_RANKS) if WORLD > 1 else hvd.global_process_set


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def rank_data(r: int, shape: tuple[int, ...], dtype: str, salt: int = 0) -> np.ndarray:
    """Rank ``r``'s input: small integers (exact in every dtype, products stay in range)."""
    n = int(np.prod(shape))
    values = (np.arange(n) * 3 + 5 * r + salt) % 4 + (0 if dtype == "uint8" else -1)
    return values.reshape(shape).astype(np_dtype(dtype))


def tol(dtype: str) -> float:
    return 1e-2 if dtype in ("float16", "bfloat16") else 1e-6


def check(got, want: np.ndarray, what: str, dtype: str = "float64") -> None:
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.allclose(g, w, rtol=tol(dtype), atol=tol(dtype)):
        raise AssertionError(f"{what}: got {g.ravel()[:8]}, want {w.ravel()[:8]}")


def run(mode: str, fn, *args):
    """``fn(*args)`` eagerly, or traced and run as a ``tf.function``."""
    return fn(*args) if mode == "eager" else tf.function(fn)(*args)


def splits_of(src: int, world: int) -> list[int]:
    """The rows rank ``src`` sends to each rank in the alltoall checks."""
    return [(src + j) % 2 + 1 for j in range(world)]


def scatter_rows(rows: int, world: int, r: int) -> slice:
    """Rank ``r``'s rows of a reducescatter (the first ``rows % world`` ranks get one more)."""
    counts = [rows // world + (1 if i < rows % world else 0) for i in range(world)]
    start = sum(counts[:r])
    return slice(start, start + counts[r])


# --- ops: every op x dtype x (eager, tf.function) against NumPy -----------------------------


def ops() -> None:
    me, world = hvd.rank(), hvd.size()
    rs = range(world)
    for mode in MODES:
        for dtype in DTYPES:
            tdt = tf.as_dtype(np_dtype(dtype))
            x = rank_data(me, (2, 3), dtype)
            every = [rank_data(r, (2, 3), dtype) for r in rs]
            uneven = rank_data(me, (me + 1, 2), dtype, salt=1)
            split = splits_of(me, world)
            a2a = rank_data(me, (sum(split), 2), dtype, salt=2)
            rows = 2 * world + 1
            scat = rank_data(me, (rows, 2), dtype, salt=3)

            def step(x, uneven, a2a, scat):
                out = {
                    "sum": hvd.allreduce(x, op=hvd.Sum),
                    "min": hvd.allreduce(x, op=hvd.Min),
                    "max": hvd.allreduce(x, op=hvd.Max),
                    "product": hvd.allreduce(x, op=hvd.Product),
                    "scaled": hvd.allreduce(
                        x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5
                    ),
                    "grouped": hvd.grouped_allreduce([x, scat], op=hvd.Sum),
                    "allgather": hvd.allgather(uneven),
                    "grouped_allgather": hvd.grouped_allgather([uneven, x]),
                    "broadcast": hvd.broadcast(x, root_rank=world - 1),
                    "alltoall": hvd.alltoall(a2a, splits=split),
                    "alltoall_even": hvd.alltoall(tf.tile(x, [world, 1])),
                    "reducescatter": hvd.reducescatter(scat, op=hvd.Sum),
                    "grouped_reducescatter": hvd.grouped_reducescatter([scat, scat], op=hvd.Max),
                    "subset": (
                        hvd.allreduce(x, op=hvd.Sum, process_set=SUBSET) if SUBSET.included() else x
                    ),
                }
                if tdt.is_floating:
                    out["average"] = hvd.allreduce(x)
                    out["fp16"] = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
                    out["reducescatter_avg"] = hvd.reducescatter(scat)
                return out

            got = run(
                mode, step, tf.constant(x), tf.constant(uneven), tf.constant(a2a), tf.constant(scat)
            )
            what = f"{mode} {dtype}"
            stack = np.stack([e.astype(np.float64) for e in every])
            dt = np_dtype(dtype)
            check(got["sum"], stack.sum(0).astype(dt), f"{what} Sum", dtype)
            check(got["min"], stack.min(0).astype(dt), f"{what} Min", dtype)
            check(got["max"], stack.max(0).astype(dt), f"{what} Max", dtype)
            check(got["product"], stack.prod(0).astype(dt), f"{what} Product", dtype)
            check(got["scaled"], stack.sum(0).astype(dt), f"{what} Sum pre 2 post 0.5", dtype)
            scats = [rank_data(r, (rows, 2), dtype, salt=3).astype(np.float64) for r in rs]
            check(got["grouped"][0], stack.sum(0).astype(dt), f"{what} grouped[0]", dtype)
            check(got["grouped"][1], sum(scats).astype(dt), f"{what} grouped[1]", dtype)
            gathered = np.concatenate([rank_data(r, (r + 1, 2), dtype, salt=1) for r in rs])
            check(got["allgather"], gathered, f"{what} allgather", dtype)
            check(got["grouped_allgather"][0], gathered, f"{what} grouped_allgather[0]", dtype)
            check(
                got["grouped_allgather"][1],
                np.concatenate(every),
                f"{what} grouped_allgather[1]",
                dtype,
            )
            check(got["broadcast"], every[world - 1], f"{what} broadcast", dtype)
            received = []
            for src in rs:
                sp = splits_of(src, world)
                data = rank_data(src, (sum(sp), 2), dtype, salt=2)
                received.append(data[sum(sp[:me]) : sum(sp[: me + 1])])
            out, rsplits = got["alltoall"]
            check(out, np.concatenate(received), f"{what} alltoall", dtype)
            check(
                rsplits,
                np.array([splits_of(s, world)[me] for s in rs], np.int32),
                f"{what} alltoall received splits",
                "int32",
            )
            check(got["alltoall_even"], np.concatenate(every), f"{what} alltoall even", dtype)
            part = scatter_rows(rows, world, me)
            check(got["reducescatter"], sum(scats)[part].astype(dt), f"{what} reducescatter", dtype)
            check(
                got["grouped_reducescatter"][1],
                np.max(scats, axis=0)[part].astype(dt),
                f"{what} grouped_reducescatter Max",
                dtype,
            )
            if SUBSET.included():
                subset_sum = sum(every[r].astype(np.float64) for r in SUBSET_RANKS)
                check(got["subset"], subset_sum.astype(dt), f"{what} subset", dtype)
            if tdt.is_floating:
                check(got["average"], stack.mean(0).astype(dt), f"{what} Average", dtype)
                check(got["fp16"], stack.sum(0).astype(dt), f"{what} fp16 compression", dtype)
                check(
                    got["reducescatter_avg"],
                    (sum(scats) / world)[part].astype(dt),
                    f"{what} reducescatter Average",
                    dtype,
                )
        # bool travels through the data-moving ops.
        flags = np.array([me % 2 == 0, True, False])

        def moves(flags):
            return hvd.allgather(flags), hvd.broadcast(flags, root_rank=0)

        gathered, broadcast = run(mode, moves, tf.constant(flags))
        want = np.concatenate([np.array([r % 2 == 0, True, False]) for r in rs])
        check(gathered, want, f"{mode} bool allgather", "int32")
        check(broadcast, np.array([True, True, False]), f"{mode} bool broadcast", "int32")
        adasum(mode)


def adasum(mode: str) -> None:
    """``op=hvd.Adasum``: Horovod's pairwise formula on a power-of-two job, refused on every
    rank of any other size."""
    me, world = hvd.rank(), hvd.size()
    x = tf.constant(np.arange(4, dtype=np.float32) + me)
    if world & (world - 1):
        try:
            run(mode, lambda t: hvd.allreduce(t, op=hvd.Adasum), x)
        except NotSupportedError as err:  # at the call, also while tracing
            assert "power of 2" in str(err), err
            return
        raise AssertionError(f"{mode} Adasum on {world} ranks was not refused")
    parts = [np.arange(4, dtype=np.float64) + r for r in range(world)]
    while len(parts) > 1:  # the pairwise combination, level by level (Horovod's tree)
        pairs = zip(parts[0::2], parts[1::2])
        parts = [(1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b for a, b in pairs]
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Adasum), x)
    check(got, parts[0].astype(np.float32), f"{mode} Adasum", "float32")


# --- grads: every differentiable op against its analytic (Horovod's) gradient ---------------


def weights_of(r: int, shape: tuple[int, ...]) -> np.ndarray:
    """Rank ``r``'s upstream gradient: ``L_r = sum(w_r * y_r)`` makes ``dL_r/dy_r = w_r``."""
    return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) + 1) * (r + 1)


def grads() -> None:
    me, world = hvd.rank(), hvd.size()
    rs = range(world)
    for mode in MODES:
        x = tf.constant(rank_data(me, (2, 3), "float64"))
        uneven = tf.constant(rank_data(me, (me + 1, 2), "float64"))
        split = splits_of(me, world)
        a2a = tf.constant(rank_data(me, (sum(split), 2), "float64"))
        rows = 2 * world + 1
        scat = tf.constant(rank_data(me, (rows, 2), "float64"))
        part = scatter_rows(rows, world, me)
        recv = [splits_of(s, world)[me] for s in rs]
        w_square = weights_of(me, (2, 3))
        w_gather = weights_of(me, (world * (world + 1) // 2, 2))
        w_a2a = weights_of(me, (sum(recv), 2))
        w_scat = weights_of(me, (part.stop - part.start, 2))

        def step(x, uneven, a2a, scat):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch([x, uneven, a2a, scat])
                ys = {
                    "sum": hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0),
                    "average": hvd.allreduce(x),
                    "grouped": hvd.grouped_allreduce([x, 2.0 * x], op=hvd.Sum),
                    "allgather": hvd.allgather(uneven),
                    "broadcast": hvd.broadcast(x, root_rank=world - 1),
                    "alltoall": hvd.alltoall(a2a, splits=split)[0],
                    "reducescatter_sum": hvd.reducescatter(scat, op=hvd.Sum),
                    "reducescatter_avg": hvd.reducescatter(scat),
                }
                losses = {
                    "sum": tf.reduce_sum(w_square * ys["sum"]),
                    "average": tf.reduce_sum(w_square * ys["average"]),
                    "grouped": tf.reduce_sum(w_square * ys["grouped"][0])
                    + tf.reduce_sum(w_square * ys["grouped"][1]),
                    "allgather": tf.reduce_sum(w_gather * ys["allgather"]),
                    "broadcast": tf.reduce_sum(w_square * ys["broadcast"]),
                    "alltoall": tf.reduce_sum(w_a2a * ys["alltoall"]),
                    "reducescatter_sum": tf.reduce_sum(w_scat * ys["reducescatter_sum"]),
                    "reducescatter_avg": tf.reduce_sum(w_scat * ys["reducescatter_avg"]),
                }
            inputs = {
                "sum": x,
                "average": x,
                "grouped": x,
                "allgather": uneven,
                "broadcast": x,
                "alltoall": a2a,
                "reducescatter_sum": scat,
                "reducescatter_avg": scat,
            }
            return {k: tape.gradient(losses[k], inputs[k]) for k in losses}

        got = run(mode, step, x, uneven, a2a, scat)
        all_square = [weights_of(r, (2, 3)) for r in rs]
        total = sum(all_square)
        check(got["sum"], 6.0 * total, f"{mode} d allreduce(Sum, pre 2, post 3)")
        check(got["average"], total / world, f"{mode} d allreduce(Average)")
        check(got["grouped"], 3.0 * total, f"{mode} d grouped_allreduce(x, 2x)")
        offset = me * (me + 1) // 2
        mean_gather = sum(weights_of(r, w_gather.shape) for r in rs) / world
        check(got["allgather"], mean_gather[offset : offset + me + 1], f"{mode} d allgather")
        root_grad = total / world if me == world - 1 else np.zeros((2, 3))
        check(got["broadcast"], root_grad, f"{mode} d broadcast")
        # Rank j's output rows from me are w_j's rows at my offset in j's output.
        pieces = []
        for j in rs:
            recv_j = [splits_of(s, world)[j] for s in rs]
            w_j = weights_of(j, (sum(recv_j), 2))
            pieces.append(w_j[sum(recv_j[:me]) : sum(recv_j[: me + 1])])
        check(got["alltoall"], np.concatenate(pieces), f"{mode} d alltoall")
        gathered = np.concatenate(
            [
                weights_of(
                    r, (scatter_rows(rows, world, r).stop - scatter_rows(rows, world, r).start, 2)
                )
                for r in rs
            ]
        )
        check(got["reducescatter_sum"], gathered * world, f"{mode} d reducescatter(Sum)")
        check(got["reducescatter_avg"], gathered, f"{mode} d reducescatter(Average)")


# --- tape: Horovod's TensorFlow 2 custom loop == one process on the size-times batch --------

FEATURES, CLASSES, LOCAL, STEPS = 5, 3, 8, 6


def model(seed: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential(
        [
            tf.keras.Input((FEATURES,), dtype="float64"),
            tf.keras.layers.Dense(7, activation="tanh", dtype="float64"),
            tf.keras.layers.Dense(CLASSES, dtype="float64"),
        ]
    )


def batches(world: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(STEPS, world * LOCAL, FEATURES))
    y = (x[..., 0] + x[..., 1] > 0).astype(np.int64) + (x[..., 2] > 1).astype(np.int64)
    return x, y


def tape() -> None:
    me, world = hvd.rank(), hvd.size()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = batches(world)

    # Horovod's example: every rank initialises differently; the broadcast after the first
    # step makes them all continue from rank 0's weights and optimizer state.
    net = model(seed=100 + me)
    opt = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as gt:
            loss_value = loss(labels, net(images, training=True))
        dtape = hvd.DistributedGradientTape(gt)
        grads = dtape.gradient(loss_value, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(net.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    mine = slice(me * LOCAL, (me + 1) * LOCAL)
    for step in range(STEPS):
        training_step(tf.constant(x[step, mine]), tf.constant(y[step, mine]), step == 0)

    # The reference, in one process: step 0 averages the gradients each rank computed at its
    # own initial weights (what the ranks did) and applies them to rank 0's; every later step
    # is plain training on the whole (world x LOCAL)-row batch.
    nets = [model(seed=100 + r) for r in range(world)]
    ref_opt = tf.keras.optimizers.Adam(0.01)
    step0 = []
    for r, n in enumerate(nets):
        rows = slice(r * LOCAL, (r + 1) * LOCAL)
        with tf.GradientTape() as gt:
            value = loss(y[0, rows], n(x[0, rows], training=True))
        step0.append(gt.gradient(value, n.trainable_variables))
    ref = nets[0]
    ref_opt.apply_gradients(zip([sum(gs) / world for gs in zip(*step0)], ref.trainable_variables))
    for step in range(1, STEPS):
        with tf.GradientTape() as gt:
            value = loss(y[step], ref(x[step], training=True))
        ref_opt.apply_gradients(
            zip(gt.gradient(value, ref.trainable_variables), ref.trainable_variables)
        )
    for i, (got, want) in enumerate(zip(net.weights, ref.weights)):
        got, want = np.asarray(got), np.asarray(want)
        if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
            raise AssertionError(f"weight {i} differs by {np.abs(got - want).max()}")
    # Training on the local shard alone ends elsewhere (the check can fail).
    alone = model(seed=100)
    alone_opt = tf.keras.optimizers.Adam(0.01)
    for step in range(STEPS):
        with tf.GradientTape() as gt:
            value = loss(y[step, mine], alone(x[step, mine], training=True))
        alone_opt.apply_gradients(
            zip(gt.gradient(value, alone.trainable_variables), alone.trainable_variables)
        )
    diff = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(alone.weights, ref.weights)
    )
    assert diff > 1e-3, f"local-only training matched the reference ({diff})"


def optimizer() -> None:
    """hvd.DistributedOptimizer (a Keras optimizer) in a tf.function custom loop: the same
    weights as one process on the whole batch (same initial weights)."""
    me, world = hvd.rank(), hvd.size()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = batches(world)
    mine = slice(me * LOCAL, (me + 1) * LOCAL)
    net = model(seed=11)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9))

    @tf.function
    def step(images, labels):
        with tf.GradientTape() as gt:
            value = loss(labels, net(images, training=True))
        opt.apply_gradients(
            zip(gt.gradient(value, net.trainable_variables), net.trainable_variables)
        )

    for s in range(STEPS):
        step(tf.constant(x[s, mine]), tf.constant(y[s, mine]))
    ref = model(seed=11)
    ref_opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    for s in range(STEPS):
        with tf.GradientTape() as gt:
            value = loss(y[s], ref(x[s], training=True))
        ref_opt.apply_gradients(
            zip(gt.gradient(value, ref.trainable_variables), ref.trainable_variables)
        )
    for i, (got, want) in enumerate(zip(net.weights, ref.weights)):
        if not np.allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6):
            raise AssertionError(f"DistributedOptimizer: weight {i} differs")
    try:
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        raise AssertionError("a TensorFlow 1 optimizer was accepted")
    except NotSupportedError:
        pass
    adasum_optimizer()


def adasum_optimizer() -> None:
    """DistributedOptimizer(op=hvd.Adasum): one SGD step applies the Adasum combination of the
    ranks' gradients, per variable (Horovod's Keras optimizer); refused on 3 ranks."""
    me, world = hvd.rank(), hvd.size()
    sgd = tf.keras.optimizers.SGD(0.1)
    if world & (world - 1):
        try:
            hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
        except NotSupportedError as err:
            assert "power of 2" in str(err), err
            return
        raise AssertionError(f"DistributedOptimizer(op=Adasum) on {world} ranks was accepted")
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = batches(world)

    def grads_of(net, r):
        rows = slice(r * LOCAL, (r + 1) * LOCAL)
        with tf.GradientTape() as gt:
            value = loss(y[0, rows], net(x[0, rows], training=True))
        return gt.gradient(value, net.trainable_variables)

    net = model(seed=12)
    start = [np.asarray(v, np.float64) for v in net.trainable_variables]
    every = [[np.asarray(g, np.float64).ravel() for g in grads_of(net, r)] for r in range(world)]
    opt = hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    step = tf.function(lambda: opt.apply_gradients(zip(grads_of(net, me), net.trainable_variables)))
    step()
    for i, (variable, w0) in enumerate(zip(net.trainable_variables, start)):
        parts = [grads[i] for grads in every]
        while len(parts) > 1:
            parts = [
                (1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b
                for a, b in zip(parts[0::2], parts[1::2])
            ]
        want = w0 - 0.1 * parts[0].reshape(w0.shape)
        if not np.allclose(np.asarray(variable, np.float64), want, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"DistributedOptimizer(op=Adasum): variable {i} differs")


def sync_batch_norm() -> None:
    """SyncBatchNormalization on each rank's rows == BatchNormalization on the whole batch:
    outputs, moving statistics and the gradients of the summed loss, in a tf.function."""
    me, world = hvd.rank(), hvd.size()
    rng = np.random.default_rng(9)
    x = rng.normal(loc=2.0, scale=3.0, size=(world * 4, 5))
    w = rng.normal(size=(world * 4, 5))
    mine = slice(me * 4, (me + 1) * 4)
    sync = hvd.SyncBatchNormalization(momentum=0.5, dtype="float64")
    plain = tf.keras.layers.BatchNormalization(momentum=0.5, dtype="float64")
    alone = tf.keras.layers.BatchNormalization(momentum=0.5, dtype="float64")
    for layer in (sync, plain, alone):
        layer.build((None, 5))  # variables outside the tf.function

    @tf.function
    def step(layer, xs, ws):
        xs = tf.convert_to_tensor(xs)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            out = layer(xs, training=True)
            value = tf.reduce_sum(ws * out)
        return out, tape.gradient(value, xs)

    out, grad = step(sync, x[mine], w[mine])
    ref_out, ref_grad = step(plain, x, w)
    check(out, np.asarray(ref_out)[mine], "sync batch norm output")
    check(grad, np.asarray(ref_grad)[mine], "sync batch norm input gradient")
    check(sync.moving_mean, np.asarray(plain.moving_mean), "sync batch norm moving mean")
    check(sync.moving_variance, np.asarray(plain.moving_variance), "moving variance")
    local_out, _ = step(alone, x[mine], w[mine])
    assert not np.allclose(np.asarray(local_out), np.asarray(ref_out)[mine], atol=1e-3)


def elastic() -> None:
    """hvd.elastic: TensorFlowState and TensorFlowKerasState sync/commit/restore, and run
    recovering (restore, reset, retry from the commit) from a collective that fails inside a
    tf.function train step; the recovered run ends where an uninterrupted one does."""
    me, world = hvd.rank(), hvd.size()
    # TensorFlowState: ranks start different; sync gives rank 0's values; restore goes back.
    pair = [tf.Variable(np.full(3, float(me))), tf.Variable(float(me) + 10.0)]
    state = hvd.elastic.TensorFlowState(pair, step=me)
    state.sync()
    assert all(
        np.array_equal(np.asarray(v), np.asarray(w)) for v, w in zip(pair, [np.zeros(3), 10.0])
    )
    assert state.step == 0
    pair[0].assign([5.0, 5.0, 5.0])
    state.step = 7
    state.restore()
    assert np.array_equal(np.asarray(pair[0]), np.zeros(3)) and state.step == 0

    # TensorFlowKerasState with a custom loop; one round breaks at step 3 with a mismatch.
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = batches(world)
    mine = slice(me * LOCAL, (me + 1) * LOCAL)
    net = model(seed=20 + me)
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(net.trainable_variables)
    kstate = hvd.elastic.TensorFlowKerasState(net, optimizer=opt, batch=0)
    broken = {"at": 3}

    def make_step():
        @tf.function
        def training_step(images, labels, probe):
            with tf.GradientTape() as gt:
                value = loss(labels, net(images, training=True))
            grads = hvd.DistributedGradientTape(gt).gradient(value, net.trainable_variables)
            opt.apply_gradients(zip(grads, net.trainable_variables))
            hvd.allreduce(probe, name="elastic.probe")
            return value

        return training_step

    rounds = []

    @hvd.elastic.run
    def train(state):
        rounds.append(state.batch)
        step = make_step()  # traced for this round's job
        while state.batch < STEPS:
            b = state.batch
            rows = 2 + me if b == broken["at"] and len(rounds) == 1 else 2
            step(tf.constant(x[b, mine]), tf.constant(y[b, mine]), tf.ones([rows]))
            state.batch += 1
            state.commit()
        return [np.asarray(w) for w in net.weights]

    kstate.sync()
    start = ([np.asarray(w) for w in net.weights], [np.asarray(v) for v in opt.variables])
    final = train(kstate)
    assert rounds == [0, broken["at"]], f"rounds started at batches {rounds}"
    for var, value in zip(net.weights, start[0]):
        var.assign(value)
    for var, value in zip(opt.variables, start[1]):
        var.assign(value)
    step = make_step()
    for b in range(STEPS):
        step(tf.constant(x[b, mine]), tf.constant(y[b, mine]), tf.ones([2]))
    for i, (got, want) in enumerate(zip(final, net.weights)):
        if not np.allclose(got, np.asarray(want), rtol=1e-6, atol=1e-6):
            raise AssertionError(
                f"the recovered run's weight {i} differs from an uninterrupted one"
            )


# --- tape_options: groups, predivide, sparse, partial tape, one crossing per step -----------


def pyfunc_nodes(fn, *args) -> int:
    graph = tf.function(fn).get_concrete_function(*args).graph
    return sum(
        op.type in ("PyFunc", "PyFuncStateless", "EagerPyFunc") for op in graph.get_operations()
    )


def tape_options() -> None:
    me, world = hvd.rank(), hvd.size()
    v = [tf.Variable(np.arange(4.0) + i) for i in range(5)]
    scale = tf.constant(float(me + 1), tf.float64)
    want_mean = np.mean([r + 1.0 for r in range(world)])

    def grads_with(**kwargs):
        def step(scale):
            with tf.GradientTape() as gt:
                value = sum(tf.reduce_sum(scale * (i + 1.0) * var * var) for i, var in enumerate(v))
            return hvd.DistributedGradientTape(gt, **kwargs).gradient(value, v)

        return step

    for kwargs in (
        {},
        {"groups": 2},
        {"groups": [[v[0], v[3]], [v[1]]]},
        {"gradient_predivide_factor": 2.0},
        {"compression": hvd.Compression.fp16},
    ):
        for mode in MODES:
            got = run(mode, grads_with(**kwargs), scale)
            for i, g in enumerate(got):
                want = want_mean * (i + 1.0) * 2 * (np.arange(4.0) + i)
                check(
                    g,
                    want,
                    f"{mode} tape {kwargs} grad {i}",
                    "float16" if kwargs.get("compression") else "float64",
                )
    # num_groups: Horovod's deprecated spelling of groups, with its warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = grads_with(num_groups=3)(scale)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), caught
    for i, g in enumerate(got):
        check(g, want_mean * (i + 1.0) * 2 * (np.arange(4.0) + i), f"num_groups grad {i}")
    # Sum instead of Average.
    got = grads_with(op=hvd.Sum)(scale)
    check(got[0], want_mean * world * 2 * np.arange(4.0), "tape op=Sum")
    # One crossing per step: every gradient in ONE numpy_function node, and one fused
    # collective in the engine.
    assert pyfunc_nodes(grads_with(), scale) == 1, pyfunc_nodes(grads_with(), scale)
    assert pyfunc_nodes(grads_with(groups=2), scale) == 2
    before = hvd.engine_stats()["collectives"]
    tf.function(grads_with())(scale)
    fused = hvd.engine_stats()["collectives"] - before
    assert fused == 1, f"5 gradients took {fused} collectives"

    # Sparse: an embedding lookup's gradient is a tf.IndexedSlices, gathered by default
    # (values and indices of every rank), reduced densely with sparse_as_dense.
    table = tf.Variable(np.zeros((6, 2)))
    ids = tf.constant([me, 5], tf.int32)

    def sparse_step(sparse_as_dense):
        def step(ids):
            with tf.GradientTape() as gt:
                value = tf.reduce_sum(tf.gather(table, ids) * float(me + 1))
            return hvd.DistributedGradientTape(gt, sparse_as_dense=sparse_as_dense).gradient(
                value, table
            )

        return step

    dense_want = np.zeros((6, 2))
    for r in range(world):
        dense_want[[r, 5]] += (r + 1.0) / world
    for mode in MODES:
        gathered = run(mode, sparse_step(False), ids)
        assert isinstance(gathered, tf.IndexedSlices), type(gathered)
        check(tf.convert_to_tensor(gathered), dense_want, f"{mode} sparse gathered")
        assert gathered.indices.shape[0] == 2 * world, gathered.indices.shape
        dense = run(mode, sparse_step(True), ids)
        assert not isinstance(dense, tf.IndexedSlices)
        check(dense, dense_want, f"{mode} sparse_as_dense")

    # hvd.allreduce of a tf.IndexedSlices directly: gathered (Sum), or divided by the size
    # (Average); other ops and scale factors are refused, as Horovod.
    part = tf.IndexedSlices(
        tf.constant([[float(me), 1.0]]), tf.constant([me]), dense_shape=tf.constant([4, 2])
    )
    for mode in MODES:
        summed, averaged = run(
            mode, lambda p: (hvd.allreduce(p, op=hvd.Sum), hvd.allreduce(p)), part
        )
        want = np.zeros((4, 2), np.float32)
        for r in range(world):
            want[r] = [r, 1.0]
        what = f"{mode} allreduce(IndexedSlices"
        check(tf.convert_to_tensor(summed), want, f"{what}, Sum)", "float32")
        check(tf.convert_to_tensor(averaged), want / world, f"{what})", "float32")
    for kwargs in ({"op": hvd.Max}, {"op": hvd.Sum, "prescale_factor": 2.0}):
        try:
            hvd.allreduce(part, **kwargs)
            raise AssertionError(f"allreduce(IndexedSlices, {kwargs}) was accepted")
        except NotSupportedError:
            pass

    # PartialDistributedGradientTape: a local layer's gradient is not reduced (it is divided by
    # the size, as Horovod's scale_local_gradients).
    net = model(seed=5)
    xs = tf.constant(np.full((2, FEATURES), float(me + 1)))
    with tf.GradientTape() as gt:
        value = tf.reduce_sum(net(xs))
    ptape = hvd.PartialDistributedGradientTape(gt, local_layers=[net.layers[-1]])
    got = ptape.gradient(value, net.trainable_variables)
    with tf.GradientTape() as gt:
        value = tf.reduce_sum(net(xs))
    local = gt.gradient(value, net.trainable_variables)
    check(got[-1], np.asarray(local[-1]) / world, "partial tape: local bias")
    mean_kernel = hvd.allreduce(local[0])
    check(got[0], np.asarray(mean_kernel), "partial tape: shared kernel")


# --- errors: mismatches on every rank, XLA refused; the job stays usable --------------------


def errors() -> None:
    me = hvd.rank()
    try:
        hvd.allreduce(tf.ones([4 + me]), op=hvd.Sum, name="tf.shape")
        raise AssertionError("eager shape mismatch gave no error")
    except MismatchError as err:
        print(f"rank {me}: eager MismatchError: {err}", flush=True)

    @tf.function
    def mismatched(x):
        return hvd.allreduce(x, op=hvd.Sum, name="tf.graph_shape")

    try:
        mismatched(tf.ones([4 + me]))
        raise AssertionError("tf.function shape mismatch gave no error")
    except tf.errors.OpError as err:
        assert "MismatchError" in str(err), str(err)
        print(f"rank {me}: tf.function MismatchError through {type(err).__name__}", flush=True)

    @tf.function(jit_compile=True)
    def xla(x):
        return hvd.allreduce(x)

    try:
        xla(tf.ones([2]))
        raise AssertionError("XLA was not refused")
    except ConfigError as err:
        assert "jit_compile=False" in str(err), str(err)
    total = hvd.allreduce(tf.ones([3]), op=hvd.Sum, name="tf.after")
    check(total, np.full(3, float(hvd.size()), np.float32), "allreduce after errors", "float32")


# --- objects: broadcast_object, allgather_object, join, barrier, rank ops --------------------


def objects() -> None:
    me, world = hvd.rank(), hvd.size()
    got = hvd.broadcast_object({"from": me, "items": [1, 2]}, root_rank=world - 1)
    assert got == {"from": world - 1, "items": [1, 2]}, got
    assert hvd.allgather_object(("rank", me)) == [("rank", r) for r in range(world)]
    hvd.barrier()

    @tf.function
    def sizes():
        return hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op()

    assert [int(t) for t in sizes()] == [world, me, hvd.local_size(), hvd.local_rank()]
    assert int(hvd.process_set_included_op(SUBSET.process_set_id)) == int(me in SUBSET_RANKS)
    assert int(hvd.size_op(SUBSET.process_set_id)) == len(SUBSET_RANKS)
    # broadcast_ assigns in place; broadcast_variables inside tf.function too.
    var = tf.Variable([float(me)] * 3)
    hvd.broadcast_([var], root_rank=world - 1)
    check(var, np.full(3, world - 1.0, np.float32), "broadcast_", "float32")
    var2 = tf.Variable([float(me)] * 2)
    tf.function(lambda: hvd.broadcast_variables([var2], root_rank=1))()
    check(var2, np.full(2, 1.0, np.float32), "broadcast_variables in tf.function", "float32")

    # Graph op names depend neither on the other ops a rank adds nor on how often a rank
    # traced: rank 0 adds ops before the allreduce; then only rank 1 retraces (a bigger
    # batch), as with an uneven last batch.
    @tf.function
    def column_sums(x):
        if me == 0:
            x = tf.identity(x) * 1.0 + 0.0
        return hvd.allreduce(tf.reduce_sum(x, axis=0), op=hvd.Sum)

    check(column_sums(tf.ones([2, 3])), np.full(3, 2.0 * world, np.float32), "sums", "float32")
    rows = 2 + (me == 1)
    want = np.full(3, 2.0 * world + 1, np.float32)
    check(column_sums(tf.ones([rows, 3])), want, "sums after rank 1 retraced", "float32")

    # TensorFlow 1: broadcast_global_variables in a graph run by a session; refused eagerly.
    with tf.Graph().as_default():
        gv = tf.compat.v1.Variable([float(me)] * 2, name="global_v")
        sync = hvd.broadcast_global_variables(world - 1)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(sync)
            check(session.run(gv), np.full(2, world - 1.0, np.float32), "TF1 global", "float32")
    # ... and through Horovod's hook, in a MonitoredSession (which initializes the variables).
    with tf.Graph().as_default():
        gv = tf.compat.v1.Variable([float(me)] * 2, name="hooked_v")
        hooks = [hvd.BroadcastGlobalVariablesHook(world - 1)]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
            check(session.run(gv), np.full(2, world - 1.0, np.float32), "TF1 hook", "float32")
        bcast = hvd.broadcast_object_fn(root_rank=world - 1)
        assert bcast({"rank": me}) == {"rank": world - 1}
    try:
        hvd.broadcast_global_variables(0)
        raise AssertionError("broadcast_global_variables ran eagerly")
    except NotSupportedError:
        pass
    pair = [tf.Variable(1.0), tf.Variable(2.0)]
    assert hvd.refs_to_vars(hvd.vars_to_refs(pair)) == pair
    last = hvd.join()
    assert 0 <= int(last) < world, int(last)


SCENARIOS = {
    "ops": ops,
    "grads": grads,
    "tape": tape,
    "optimizer": optimizer,
    "sync_batch_norm": sync_batch_norm,
    "elastic": elastic,
    "tape_options": tape_options,
    "errors": errors,
    "objects": objects,
}


def main() -> None:
    hvd.init(process_sets=[SUBSET] if WORLD > 1 else None)
    for name in sys.argv[1:]:
        SCENARIOS[name]()
        print(f"rank {hvd.rank()}: {name} ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
