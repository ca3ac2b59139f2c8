"""kolo.tensorflow (Horovod's ``horovod.tensorflow``) on 2 and 3 ranks under kolorun.

tests/workers/tensorflow_worker.py runs the scenarios in order; every rank checks its results
against NumPy references and prints ``rank R: <scenario> ok``. One launch per rank count runs
every scenario (TensorFlow's import is slow); a failing scenario stops its launch, so the
tests of the scenarios after it fail too, saying so. TensorFlow is only ever loaded in those
rank processes and in the subprocesses of the import tests, never in pytest's own process
(TensorFlow and torch's triton abort a process that loads triton second).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, check_digits_example, check_scenario, run_kolorun, worker, worker_env

SCENARIOS = (
    "ops",
    "grads",
    "tape",
    "optimizer",
    "sync_batch_norm",
    "elastic",
    "tape_options",
    "errors",
    "objects",
)
#: The scenarios of each launch: a one-rank job runs the collectives and their gradients.
SCENARIOS_OF = {1: ("ops", "grads"), 2: SCENARIOS, 3: SCENARIOS}
RANKS = pytest.mark.parametrize("ranks", [2, 3])


@functools.cache
def launch(ranks: int) -> subprocess.CompletedProcess:
    return run_kolorun(
        ["-np", str(ranks), "python", worker("tensorflow_worker.py"), *SCENARIOS_OF[ranks]],
        timeout=420,
        env={"TF_CPP_MIN_LOG_LEVEL": "2", "KOLO_STALL_CHECK_TIME_SECONDS": "30"},
    )


def check(ranks: int, scenario: str) -> subprocess.CompletedProcess:
    order = SCENARIOS_OF[ranks]
    return check_scenario(launch(ranks), scenario, order, ranks, launch=f"{ranks} ranks")


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_every_op_and_dtype_eagerly_and_inside_tf_function_against_numpy(ranks: int) -> None:
    # allreduce (Sum/Min/Max/Product/Average, pre/postscale, fp16 on the wire, a process set),
    # grouped_allreduce, allgather (uneven rows), grouped_allgather, broadcast from the last
    # rank, alltoall (uneven splits with the received splits, and even), reducescatter and
    # grouped_reducescatter (rows not divisible by the size); 9 dtypes, plus bool through
    # allgather/broadcast; eagerly and in a tf.function.
    check(ranks, "ops")


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_gradients_of_every_differentiable_op_are_horovods(ranks: int) -> None:
    # d/dx of sum(w_r * op(x)) with a different w on every rank, against Horovod's analytic
    # gradients: allreduce (same op and scale factors), grouped_allreduce, allgather (averaged,
    # own rows), broadcast (averaged on the root, 0 elsewhere), alltoall (sent back),
    # reducescatter (allgathered, times the size for Sum); eagerly and in a tf.function.
    check(ranks, "grads")


@RANKS
def test_custom_training_loop_equals_one_process_on_the_whole_batch(ranks: int) -> None:
    # Horovod's TensorFlow 2 example shape: tf.function train step, DistributedGradientTape,
    # broadcast_variables of the model and the optimizer after the first step; every rank
    # initialises differently. float64 weights agree with one process (whole batch) to 1e-6;
    # training on the local shard alone ends elsewhere.
    check(ranks, "tape")


def test_distributed_optimizer_wraps_a_keras_optimizer() -> None:
    # hvd.DistributedOptimizer(tf.keras.optimizers.SGD(momentum)) in a tf.function loop: 2
    # ranks == one process on the whole batch; a TensorFlow 1 optimizer: NotSupportedError.
    check(2, "optimizer")


@RANKS
def test_sync_batch_norm_equals_batch_norm_on_the_whole_batch(ranks: int) -> None:
    # Outputs, moving statistics and input gradients of SyncBatchNormalization on each rank's
    # rows == BatchNormalization on all rows in one process; a local BatchNormalization differs.
    check(ranks, "sync_batch_norm")


@RANKS
def test_elastic_states_and_run_recover_from_a_failure_inside_tf_function(ranks: int) -> None:
    # TensorFlowState / TensorFlowKerasState sync, commit and restore; hvd.elastic.run restores
    # the last commit, resets and retries when a collective fails inside the tf.function step
    # (one rank retraced it alone first: graph op names must not depend on trace counts), and
    # ends with the weights of an uninterrupted run.
    check(ranks, "elastic")


def test_tape_groups_predivide_compression_sparse_partial_and_one_crossing_per_step() -> None:
    # groups (int, lists, deprecated num_groups), gradient_predivide_factor, fp16, op=Sum all
    # give the average; every gradient of a step crosses in ONE tf.numpy_function node and
    # ONE fused engine collective; IndexedSlices are gathered (or densified with
    # sparse_as_dense); PartialDistributedGradientTape keeps a local layer's gradient local.
    check(2, "tape_options")


@RANKS
def test_a_shape_mismatch_raises_on_every_rank_and_xla_is_refused(ranks: int) -> None:
    result = check(ranks, "errors")
    for r in range(ranks):
        assert f"[{r}]<stdout>:rank {r}: eager MismatchError: allreduce 'tf.shape'" in (
            result.stdout
        )
        assert f"[{r}]<stdout>:rank {r}: tf.function MismatchError through" in result.stdout


def test_objects_rank_ops_in_place_broadcasts_and_join() -> None:
    check(3, "objects")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=worker_env({"TF_CPP_MIN_LOG_LEVEL": "2"}),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_import_does_not_load_torch_and_torch_still_works_after_it() -> None:
    # `import kolo.tensorflow` loads triton (when installed) before TensorFlow and never torch;
    # torch.optim (which loads triton) then works in the same process.
    result = _python(
        "import sys\n"
        "import kolo.tensorflow as hvd\n"
        "assert 'tensorflow' in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
        "import tensorflow as tf, torch, torch.optim\n"
        "hvd.init()\n"
        "w = torch.nn.Parameter(torch.ones(2)); opt = torch.optim.SGD([w], lr=0.5)\n"
        "(w * w).sum().backward(); opt.step()\n"
        "assert float(hvd.allreduce(tf.constant(2.0))) == 2.0\n"
        "print('both', w.tolist())\n"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "both [0.0, 0.0]" in result.stdout


def test_tensorflow_digits_example_trains_identical_weights_on_two_ranks() -> None:
    # examples/tensorflow_digits.py (Horovod's tensorflow2_mnist.py shape): ranks start from
    # different seeds, the first-step broadcast aligns them, and they end with the same
    # weights and a useful model.
    check_digits_example("tensorflow_digits.py")


def test_bench_script_compares_with_multi_worker_mirrored_strategy(tmp_path) -> None:
    # bench/tensorflow.py still runs (tiny settings): one figure line with the ratio and the
    # per-step communication costs, and its JSON.
    out = tmp_path / "tensorflow.json"
    result = run_kolorun(
        [
            "-np",
            "2",
            "python",
            "bench/tensorflow.py",
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
        r"\[0\]<stdout>:tensorflow smallcnn batch 8x2 .*kolo +[\d.]+ samples/s \| "
        r"MultiWorkerMirroredStrategy +[\d.]+ samples/s \| ratio [\d.]+x \| communication per "
        r"step: kolo -?[\d.]+ ms, MWMS -?[\d.]+ ms",
        result.stdout,
    ), result.stdout[-3000:]
    figures = json.loads(out.read_text())
    assert figures["ranks"] == 2
    assert set(figures["samples_per_sec"]) == {"kolo", "mwms", "local"}
