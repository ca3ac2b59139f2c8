"""Unit tests of what kolo reads from mpirun/srun, Horovod's argument checks for ``comm`` and
``ProcessSet(ranks_or_comm)``, and the driver identity the no-mpi4py path needs (the processes
themselves: tests/test_mpi.py)."""

from __future__ import annotations

import secrets

import pytest

import kolo.torch as hvd
from kolo import _native
from kolo._mpi_launch import LauncherRank, launcher_rank
from kolo.exceptions import ConfigError, InvalidArgumentError


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "PMI_RANK": "0"},
            LauncherRank("mpirun (Open MPI)", 3, 4),
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, LauncherRank("mpirun (MPICH)", 1, 2)),
        (
            {"SLURM_PROCID": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3"},
            LauncherRank("srun (Slurm)", 2, 3),
        ),
        (
            {"SLURM_PROCID": "1", "SLURM_STEPID": "7", "SLURM_NTASKS": "2"},
            LauncherRank("srun (Slurm)", 1, 2),
        ),
        # A batch script runs once: SLURM_PROCID and SLURM_NTASKS, but no step.
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, None),
        ({}, None),
    ],
)
def test_launcher_rank_reads_each_launchers_variables(environ, expected) -> None:
    assert launcher_rank(environ) == expected


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x'"),
        ({"PMI_RANK": "0"}, "PMI_SIZE=''"),
        ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "out of range"),
    ],
)
def test_malformed_launcher_variables_are_config_errors_naming_them(environ, named) -> None:
    with pytest.raises(ConfigError, match=named):
        launcher_rank(environ)


def test_process_set_takes_ranks_or_a_communicator_positionally_or_by_horovods_name() -> None:
    assert hvd.ProcessSet(ranks_or_comm=[2, 0]).ranks == [0, 2]
    assert hvd.ProcessSet(range(2)).ranks == [0, 1]
    for bad in ([0, 1.5], "01", object()):
        with pytest.raises(ValueError, match="list of process ranks or an mpi4py Comm"):
            hvd.ProcessSet(bad)


def test_a_launch_driver_takes_a_known_secret_and_job_id_together() -> None:
    secret, job_id = secrets.token_hex(32), secrets.token_hex(16)
    driver = _native.LaunchDriver(2, "127.0.0.1:0", 5.0, secret=secret, job_id=job_id)
    try:
        env = dict(driver.worker_env(1))
        assert (env["KOLO_JOB_SECRET"], env["KOLO_JOB_ID"]) == (secret, job_id)
        assert driver.active_ranks() == 0
    finally:
        driver.shutdown()
    with pytest.raises(InvalidArgumentError, match="together"):
        _native.LaunchDriver(2, "127.0.0.1:0", 5.0, secret=secret)
    with pytest.raises(ConfigError, match="secret"):
        _native.LaunchDriver(2, "127.0.0.1:0", 5.0, secret="00", job_id=job_id)
