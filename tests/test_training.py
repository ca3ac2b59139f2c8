"""The training API (DistributedOptimizer, broadcasts, join, SyncBatchNorm) on 2 ranks under
kolorun, against one process training on the concatenated batch.

tests/workers/training_worker.py runs scenarios in order; every rank checks its own result
against a single-process reference and prints ``rank R: <scenario> ok``. To keep the suite
fast, one launch runs several scenarios (a failing scenario stops its launch, so the tests of
the scenarios after it fail too, saying so); each test checks one scenario.
"""

from __future__ import annotations

import functools
import subprocess

from conftest import check_scenario, run_kolorun, worker

LAUNCHES = {
    "optimizer": (
        "average",
        "predivide",
        "sum",
        "errors",
        "groups_int",
        "groups_list",
        "sparse",
        "sparse_as_dense",
        "clip",
        "accumulate",
        "fp16",
        "bf16",
        "failed_reduction",
    ),
    "state": ("broadcast", "syncbn"),
    "join": ("join",),
}


@functools.cache
def launch(group: str) -> subprocess.CompletedProcess:
    return run_kolorun(
        ["-np", "2", "python", worker("training_worker.py"), *LAUNCHES[group]], timeout=180
    )


def check(scenario: str) -> None:
    group = next(g for g, scenarios in LAUNCHES.items() if scenario in scenarios)
    check_scenario(launch(group), scenario, LAUNCHES[group], launch=group)


def test_distributed_sgd_matches_one_process_on_the_double_batch() -> None:
    # SGD with momentum, 20 steps: 2 ranks x 8 rows == 1 process x 16 rows (float64, 1e-9).
    # Also: the unused layer's gradient is reduced as zeros; local-only training is far off.
    check("average")


def test_gradient_predivide_factor_gives_the_same_average() -> None:
    check("predivide")


def test_op_sum_adds_the_rank_gradients() -> None:
    check("sum")


def test_bad_arguments_raise_value_or_invalid_argument_errors() -> None:
    # duplicate names, non-tuples, unnamed params, Adasum, predivide with Sum, bad groups/passes
    check("errors")


def test_groups_as_a_count_match_one_process() -> None:
    check("groups_int")


def test_groups_as_parameter_lists_match_one_process() -> None:
    check("groups_list")


def test_sparse_gradients_are_gathered_and_summed() -> None:
    check("sparse")


def test_sparse_as_dense_reduces_sparse_gradients_densely() -> None:
    check("sparse_as_dense")


def test_a_failed_reduction_raises_after_the_others_finished_and_the_job_goes_on() -> None:
    check("failed_reduction")


def test_gradient_clipping_between_synchronize_and_step() -> None:
    # optimizer.synchronize(); clip_grad_norm_; with optimizer.skip_synchronize(): step();
    # plus zero_grad() refusing outstanding reductions and the step-after-synchronize warning.
    check("clip")


def test_backward_passes_per_step_accumulates_locally_then_averages() -> None:
    # 2 micro-batches of 4 rows per rank (loss / 2, as in Horovod's examples) == 16-row batch.
    check("accumulate")


def test_fp16_compression_stays_close_to_the_reference() -> None:
    check("fp16")


def test_bf16_compression_stays_close_to_the_reference() -> None:
    check("bf16")


def test_broadcast_parameters_and_optimizer_state_make_ranks_equal() -> None:
    check("broadcast")


def test_sync_batch_norm_matches_batch_norm_on_the_concatenated_batch() -> None:
    check("syncbn")


def test_join_lets_a_rank_with_fewer_batches_stop_early() -> None:
    # Rank 1 has 15 batches, rank 0 has 20; steps 16..20 average rank 0's gradient with zeros
    # (divided by 2); join() returns 0, the last rank to join.
    check("join")
