"""``kolo.lightning.KoloStrategy`` (``Trainer(strategy="kolo")``) and ``KoloFabricStrategy``
(``Fabric(strategy="kolo")``) on 2 ranks under kolorun, against one process training on the
rows both ranks had (the doubled batch).

tests/workers/lightning_worker.py runs the scenarios in order; every rank checks its own result
and prints ``rank R: <scenario> ok``. One launch runs all scenarios (a failing scenario stops
the launch, so the tests of the scenarios after it fail too, saying so); each test checks one.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, check_scenario, output_tail, run_kolorun, worker, worker_env

SCENARIOS = ("equal", "accumulate", "refit", "syncbn", "fabric", "sync_dist", "checkpoint")


@functools.cache
def launch(out: str) -> subprocess.CompletedProcess:
    return run_kolorun(
        ["-np", "2", "python", worker("lightning_worker.py"), out, *SCENARIOS], timeout=240
    )


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lightning")


def check(out_dir: Path, scenario: str) -> subprocess.CompletedProcess:
    return check_scenario(launch(str(out_dir)), scenario, SCENARIOS)


def test_two_ranks_equal_one_process_on_the_doubled_batch(out_dir: Path) -> None:
    # strategy="kolo" by name; Lightning injects a DistributedSampler (2 replicas, this rank);
    # SGD with momentum, 2 epochs, float64: weights equal within 1e-9, one rank's rows alone
    # give weights far off.
    check(out_dir, "equal")


def test_gradient_accumulation_reduces_once_per_optimizer_step(out_dir: Path) -> None:
    # 2 ranks x 4 rows x accumulate_grad_batches=2 == one process on the 16 rows.
    check(out_dir, "accumulate")


def test_a_second_fit_of_the_same_module_trains_correctly(out_dir: Path) -> None:
    # The first fit's DistributedOptimizer hooks are removed at teardown.
    check(out_dir, "refit")


def test_sync_batchnorm_uses_kolo_sync_batch_norm_over_both_ranks(out_dir: Path) -> None:
    # sync_batchnorm=True: kolo.torch.SyncBatchNorm during the fit (reverted after), equal to
    # one process with BatchNorm1d on the 16 rows, running statistics included.
    check(out_dir, "syncbn")


def test_fabric_strategy_kolo_equals_one_process_on_the_doubled_batch(out_dir: Path) -> None:
    # Fabric(strategy="kolo"): setup broadcasts rank 0's weights and wraps the optimizer;
    # setup_dataloaders injects the DistributedSampler; all_reduce/broadcast.
    check(out_dir, "fabric")


def test_sync_dist_metrics_are_the_global_mean(out_dir: Path) -> None:
    # self.log(..., sync_dist=True) in validation equals the mean over all validation rows;
    # reduce/all_gather/broadcast/barrier/reduce_boolean_decision; typed errors for bad ops.
    check(out_dir, "sync_dist")


def test_only_rank_zero_writes_checkpoints(out_dir: Path) -> None:
    result = check(out_dir, "checkpoint")
    assert result.returncode == 0, result.stderr[-6000:]
    writes0 = (out_dir / "writes.rank0").read_text().splitlines()
    assert len(writes0) == 2, writes0  # one per epoch
    assert not (out_dir / "writes.rank1").exists(), (out_dir / "writes.rank1").read_text()
    assert sorted(p.name for p in (out_dir / "checkpoints").iterdir()) == [
        "epoch=0-step=4.ckpt",
        "epoch=1-step=8.ckpt",
    ]


def test_strategy_kolo_runs_as_one_rank_without_a_launcher(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, worker("lightning_worker.py"), str(tmp_path), "single"],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert "rank 0: single ok" in result.stdout, result.stdout + result.stderr[-4000:]


def test_lightnings_mpi_probe_in_a_kolorun_rank_starts_no_open_mpi_daemon() -> None:
    # A strategy given by name lets Lightning probe MPI in every rank (a singleton MPI_Init);
    # kolo.lightning makes that init skip Open MPI's orted, which on a loaded host failed to
    # start and aborted the rank.
    result = run_kolorun(["-np", "2", "python", worker("mpi_probe_worker.py")], timeout=120)
    assert result.returncode == 0, output_tail(result)
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:detected False; children []" in result.stdout, result.stdout


def test_lightning_digits_example_trains_to_90_percent_with_identical_weights() -> None:
    result = run_kolorun(["-np", "2", "python", "examples/lightning_digits.py"], timeout=300)
    assert result.returncode == 0, output_tail(result)
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy: ([\d.]+)", result.stdout).group(1))
    assert accuracy >= 0.90, result.stdout[-2000:]
    checksums = set(re.findall(r"<stdout>:rank \d+: parameter checksum (\w+)", result.stdout))
    assert len(checksums) == 1, f"ranks ended with different weights: {checksums}"
