"""Real processes at the edge of this machine (issue 25, item 5): 32 ranks on four simulated
hosts of eight (shared memory within a host, TCP between hosts: the hierarchical path) run the
collectives matrix on kolo's numpy layer under kolorun, and 16 forked torch ranks run a
training step with ``DistributedOptimizer``. Every rank checks its own results exactly; a
wrong value or a rank that hangs fails the test (each collective is bounded by
``KOLO_COLLECTIVE_TIMEOUT_SECONDS``, each launch by a timeout). bench/scale_ranks.py runs the
same at 8 to 64 ranks with timings."""

from __future__ import annotations

import json

from support.forked_ranks import run_forked_ranks

from conftest import output_tail, run_kolorun, worker, worker_env

#: Seconds one collective may take before the rank raises (a hang becomes an error).
COLLECTIVE_TIMEOUT = "60"


def reports_of(stdout: str) -> dict[int, dict]:
    reports = {}
    for line in stdout.splitlines():
        _, found, text = line.partition("SCALE ")
        if found:
            report = json.loads(text)
            reports[report["rank"]] = report
    return reports


def test_collectives_matrix_on_32_ranks_of_four_simulated_hosts() -> None:
    ranks, per_host = 32, 8
    result = run_kolorun(
        ["-np", str(ranks), "python", worker("scale_rank_worker.py"), "matrix"],
        timeout=150,
        env={
            "KOLO_TEST_RANKS_PER_HOST": str(per_host),
            "KOLO_COLLECTIVE_TIMEOUT_SECONDS": COLLECTIVE_TIMEOUT,
        },
    )
    assert result.returncode == 0, output_tail(result, 5)
    reports = reports_of(result.stdout)
    assert sorted(reports) == list(range(ranks)), output_tail(result, 5)
    for rank, report in reports.items():
        assert report["failures"] == [], (rank, report["failures"])
        # 16 allreduce cases, 2 allgathers, 2 broadcasts, 2 alltoall checks, reducescatter,
        # join's; odd ranks' allreduce beside joined ranks; the process set's two on its
        # members (every third rank from 1).
        expected = 24 + rank % 2 + (2 if rank % 3 == 1 else 0)
        assert report["checks"] == expected, report
        assert (report["size"], report["local_size"], report["cross_size"]) == (32, 8, 4)
        # Within a host the data moved through shared memory (the hierarchical path).
        assert report["shm_collectives"] > 0, report


def test_training_step_on_16_forked_torch_ranks_ends_with_identical_parameters() -> None:
    ranks = 16
    run = run_forked_ranks(
        ranks,
        ranks_per_host=4,
        modes=["train"],
        timeout=120,
        env=worker_env({"KOLO_COLLECTIVE_TIMEOUT_SECONDS": COLLECTIVE_TIMEOUT}),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert sorted(run.reports) == list(range(ranks)), run.stderr[-5000:]
    for rank, report in run.reports.items():
        assert report["failures"] == [], (rank, report["failures"])
        # Every rank compares its parameters with every other rank's; rank 0 also with one
        # process training on all ranks' batches.
        assert report["checks"] == (2 if rank == 0 else 1), report
        assert (report["size"], report["local_size"], report["cross_size"]) == (16, 4, 4)
