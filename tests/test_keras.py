"""kolo.keras on 2 ranks under kolorun, with the TensorFlow and the torch Keras backends.

tests/workers/keras_worker.py runs scenarios in order; every rank checks its own result against
a single-process reference and prints ``rank R: <scenario> ok``. One launch per backend runs
all scenarios (TensorFlow's import is slow); a failing scenario stops its launch, so the tests
of the scenarios after it fail too, saying so.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess

import pytest

from conftest import check_digits_example, check_scenario, run_kolorun, worker

SCENARIOS = (
    "ops",
    "reducescatter",
    "fit",
    "accumulate",
    "groups",
    "sparse",
    "partial",
    "errors",
    "warmup",
    "checkpoint",
)
# Keras's torch backend has no sparse (IndexedSlices) gradients.
BACKEND_SCENARIOS = {
    "tensorflow": SCENARIOS,
    "torch": tuple(s for s in SCENARIOS if s != "sparse"),
}


@functools.cache
def launch(backend: str) -> subprocess.CompletedProcess:
    return run_kolorun(
        ["-np", "2", "python", worker("keras_worker.py"), *BACKEND_SCENARIOS[backend]],
        timeout=300,
        env={"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


def check(backend: str, scenario: str) -> None:
    check_scenario(launch(backend), scenario, BACKEND_SCENARIOS[backend], launch=backend)


BACKENDS = pytest.mark.parametrize("backend", ["tensorflow", "torch"])


@BACKENDS
def test_collectives_eagerly_and_inside_tf_function(backend: str) -> None:
    # allreduce (Sum, Average, fp16 on the wire), allgather of uneven rows, broadcast from
    # rank 1, broadcast_variables; under TensorFlow also inside a tf.function, twice.
    check(backend, "ops")


@BACKENDS
def test_reducescatter_matches_numpy_eagerly_and_inside_tf_function(backend: str) -> None:
    # Sum / Average / Max / Min on float32, float64, int32 with uneven rows; under TensorFlow
    # also inside tf.function (static and unknown first dimension) and a compiled fit.
    check(backend, "reducescatter")


@BACKENDS
def test_partial_distributed_optimizer_keeps_local_layers_local(backend: str) -> None:
    # The first Dense is averaged, the head is trained on each rank's data alone (gradient
    # / size with scale_local_gradients; summed over backward_passes_per_step): both match a
    # NumPy reference of both ranks; shared weights identical on every rank, the heads differ;
    # BroadcastGlobalVariablesCallback(local_variables=...) leaves the heads' initial values.
    check(backend, "partial")


@BACKENDS
def test_fit_on_two_ranks_equals_one_process_on_the_double_batch(backend: str) -> None:
    # model.fit (compiled train step) with DistributedOptimizer(SGD momentum), 2 epochs:
    # 2 ranks x 8 rows == 1 process x 16 rows. Ranks initialise differently; the broadcast
    # callback makes them start from rank 0's weights; MetricAverageCallback logs the mean of
    # the ranks' local losses; training on the local shard alone ends elsewhere.
    check(backend, "fit")


@BACKENDS
def test_backward_passes_per_step_accumulates_before_one_allreduce(backend: str) -> None:
    check(backend, "accumulate")


@BACKENDS
def test_groups_and_predivide_factor_give_the_same_average(backend: str) -> None:
    check(backend, "groups")


def test_sparse_embedding_gradients_are_gathered_or_reduced_densely() -> None:
    # TensorFlow's Embedding gradient is a tf.IndexedSlices: gathered (default) or densified.
    check("tensorflow", "sparse")


@BACKENDS
def test_bad_arguments_raise_typed_errors(backend: str) -> None:
    check(backend, "errors")


@BACKENDS
def test_learning_rate_warmup_ramps_to_the_initial_rate(backend: str) -> None:
    check(backend, "warmup")


@BACKENDS
def test_best_model_checkpoint_and_load_model_restore_a_distributed_optimizer(
    backend: str,
) -> None:
    check(backend, "checkpoint")


def test_keras_digits_example_trains_identical_weights_on_two_ranks() -> None:
    # examples/keras_digits.py: ranks start from different seeds, the broadcast callback aligns
    # them, and the ranks end with the same weights and a useful model.
    check_digits_example("keras_digits.py")


def test_bench_script_compares_with_multi_worker_mirrored_strategy(tmp_path) -> None:
    # bench/keras.py still runs (tiny settings): one figure line with the ratio, and its JSON.
    out = tmp_path / "keras.json"
    result = run_kolorun(
        [
            "-np",
            "2",
            "python",
            "bench/keras.py",
            "--batch-size",
            "8",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--rounds",
            "1",
            "--json",
            str(out),
        ],
        timeout=300,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert re.search(
        r"\[0\]<stdout>:keras smallcnn batch 8x2 .*kolo +[\d.]+ samples/s \| "
        r"MultiWorkerMirroredStrategy +[\d.]+ samples/s \| ratio [\d.]+x",
        result.stdout,
    ), result.stdout[-3000:]
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2 and set(figures["median_samples_per_sec"]) == {"kolo", "mwms"}
