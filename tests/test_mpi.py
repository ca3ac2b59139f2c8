"""Ranks started by ``mpirun`` (real Open MPI and MPICH) or by ``srun`` (its environment, N real
processes) join one job by themselves: with mpi4py the address and secret travel by MPI
broadcast; without it, from MASTER_ADDR/MASTER_PORT and KOLO_JOB_SECRET. Horovod's
``init(comm=...)`` forms and ``ProcessSet(comm)``; mpi4py collectives interleaved with kolo's."""

from __future__ import annotations

import re
import secrets
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import BIN, REPO, run_kolorun, worker, worker_env

OPEN_MPI = shutil.which("mpirun.openmpi")
MPICH = shutil.which("mpirun.mpich")

# One intra-op thread everywhere: torch picks its thread count from the launcher's CPU binding,
# and a different count changes float summation order inside matmuls (not kolo's reductions).
SAME_THREADS = {"OMP_NUM_THREADS": "1"}


def need(launcher: str | None, what: str) -> str:
    if launcher is None:
        pytest.skip(f"{what} is not installed here; CI installs it (dev/system-deps.sh --tests)")
    return launcher


def run_mpirun(
    launcher: str, np: int, args: list[str], env: dict[str, str] | None = None, timeout=300
) -> subprocess.CompletedProcess:
    """``<launcher> -np N ARGS`` from the repo root (Open MPI: as root, oversubscribed)."""
    extra = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    flags = ["--oversubscribe"] if launcher == OPEN_MPI else []
    return subprocess.run(
        [launcher, *flags, "-np", str(np), *args],
        cwd=REPO,
        env=worker_env({**extra, **(env or {})}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def checksums(stdout: str) -> list[str]:
    # mpirun merges the ranks' unbuffered output: a line may run into the next one.
    return re.findall(r"rank \d+: parameter checksum ([0-9a-f]{16})", stdout)


def rendezvous_env() -> dict[str, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "KOLO_JOB_SECRET": secrets.token_hex(32),
    }


@pytest.fixture(scope="module")
def kolorun_checksum() -> str:
    result = run_kolorun(
        ["-np", "2", "python", "examples/torch_digits.py"], timeout=300, env=SAME_THREADS
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (checksum,) = set(checksums(result.stdout))
    return checksum


def test_mpirun_torch_digits_reaches_kolorun_weights(kolorun_checksum: str) -> None:
    """Bit-identical: same data shards by rank, and a 2-rank average is exact in any order."""
    result = run_mpirun(
        need(OPEN_MPI, "Open MPI"), 2, ["python", "examples/torch_digits.py"], SAME_THREADS
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "weights identical on all 2 ranks: True" in result.stdout, result.stdout
    assert checksums(result.stdout) == [kolorun_checksum] * 2, result.stdout


def test_mpi4py_collectives_interleave_with_kolo(kolorun_checksum: str) -> None:
    result = run_mpirun(
        need(OPEN_MPI, "Open MPI"),
        2,
        ["python", worker("mpi_interleaved_worker.py")],
        SAME_THREADS,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert checksums(result.stdout) == [kolorun_checksum] * 2, result.stdout
    agreed = re.findall(r"mpi4py and kolo agreed on (\d+) reductions", result.stdout)
    assert len(agreed) == 2 and int(agreed[0]) > 1000, result.stdout


def test_init_comm_forms_and_process_set_from_comm() -> None:
    result = run_mpirun(need(OPEN_MPI, "Open MPI"), 4, ["python", worker("mpi_comm_worker.py")])
    out = result.stdout
    assert result.returncode == 0, out[-2000:] + result.stderr[-3000:]
    for world, sub in ((0, 0), (1, 0), (2, 1), (3, 1)):
        assert f"world {world}: sub-communicator rank {sub} of 2" in out, out
    assert "world 3: listed rank 0 of 2" in out and "world 1: listed rank 1 of 2" in out, out
    assert "world 2: process set [0, 2], rank 1 in it" in out, out
    assert "world 1: process set [1, 3], rank 0 in it" in out, out
    assert "world 3: added process set [2, 3]" in out, out


def test_mpich_without_mpi4py_meets_at_master_addr() -> None:
    """mpi4py here is built for Open MPI, so under MPICH's mpirun it sees a world of one: kolo
    meets through MASTER_ADDR/MASTER_PORT, as it does with no mpi4py at all."""
    result = run_mpirun(
        need(MPICH, "MPICH"), 2, ["python", worker("mpi_env_worker.py")], rendezvous_env()
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for rank in (0, 1):
        line = f"launcher rank {rank}: rank {rank} of 2, local {rank} of 2, sum 3"
        assert f"{line}, job vars left False" in result.stdout, result.stdout


def spawn_srun_ranks(size: int, env: dict[str, str], hosts: list[str] | None = None) -> list:
    """``size`` real processes with the variables ``srun -n SIZE`` gives its tasks."""
    procs = []
    for rank in range(size):
        slurm = {
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": str(size),
            "SLURM_STEP_NUM_TASKS": str(size),
            "SLURM_STEP_TASKS_PER_NODE": str(size),
            **env,
        }
        if hosts:
            slurm["KOLO_HOSTNAME"] = hosts[rank]
        procs.append(
            subprocess.Popen(
                [sys.executable, worker("mpi_env_worker.py")],
                cwd=REPO,
                env=worker_env(slurm),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]


def test_srun_ranks_join_by_their_environment() -> None:
    results = spawn_srun_ranks(3, rendezvous_env())
    for rank, (_, out, err) in enumerate(results):
        assert f"launcher rank {rank}: rank {rank} of 3, local {rank} of 3, sum 6" in out, err


def test_interleaved_hosts_cannot_keep_mpi_ranks_and_say_why() -> None:
    """``srun -m cyclic`` over two hosts: kolo numbers a host's ranks consecutively, so MPI rank
    1 would become rank 2; every rank fails with the reason instead of training misnumbered."""
    started = time.monotonic()
    results = spawn_srun_ranks(3, rendezvous_env(), hosts=["a", "b", "a"])
    assert time.monotonic() - started < 60
    assert all(code != 0 for code, _, _ in results)
    errors = [err for _, _, err in results]
    # Rank 0 sees the assignment and aborts the job; a rank still joining gets that abort.
    assert all("this launch interleaves hosts" in e for e in errors), errors
    assert "MPI rank 1 got rank 2" in errors[0] and "MPI rank 1 got rank 2" in errors[1]


def test_missing_rendezvous_settings_fail_fast_naming_them() -> None:
    started = time.monotonic()
    result = run_mpirun(need(MPICH, "MPICH"), 2, ["python", worker("mpi_env_worker.py")])
    assert result.returncode != 0
    assert time.monotonic() - started < 30
    assert "ConfigError" in result.stderr, result.stderr[-3000:]
    assert "MASTER_ADDR and MASTER_PORT are not set" in result.stderr, result.stderr[-3000:]
    assert "KOLO_JOB_SECRET" in result.stderr and "pip install mpi4py" in result.stderr
    env = rendezvous_env()
    del env["KOLO_JOB_SECRET"]
    results = spawn_srun_ranks(2, env)
    assert all(code != 0 for code, _, _ in results)
    assert all("needs the job secret" in err for _, _, err in results), results


LIGHTNING_RANK = """
from kolo.lightning.environment import KoloEnvironment
env = KoloEnvironment()
print(f"detect {env.detect()}: rank {env.global_rank()} of {env.world_size()}", flush=True)
"""


def test_lightning_environment_detects_an_mpirun_launch() -> None:
    # mpirun sets neither KOLO_RANK nor HOROVOD_RANK: detection goes by its own variables, as
    # hvd.init() finds them.
    result = run_mpirun(need(OPEN_MPI, "Open MPI"), 2, ["python", "-c", LIGHTNING_RANK])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for rank in (0, 1):
        assert f"detect True: rank {rank} of 2" in result.stdout, result.stdout
    bare = subprocess.run(
        [sys.executable, "-c", LIGHTNING_RANK],
        cwd=REPO,
        env=worker_env({}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "detect False: rank 0 of 1" in bare.stdout, bare.stdout + bare.stderr[-2000:]


KOLORUN_MPI_RANK = (
    "import os, torch, kolo.torch as hvd; hvd.init(); "
    "total = int(hvd.allreduce(torch.tensor([hvd.rank() + 1]), op=hvd.Sum).item()); "
    "print(f'rank {hvd.rank()} of {hvd.size()}, launcher rank "
    '{os.environ["OMPI_COMM_WORLD_RANK"]}, sum {total}, probe {os.environ.get("PROBE")}\')'
)


def test_kolorun_mpi_launches_through_open_mpi_with_mpi_args() -> None:
    """``kolorun --mpi``: Horovod's mpirun command (``--tag-output`` prefixes, ``-x`` of the
    environment), ``--mpi-args`` on it, the ranks meeting over mpi4py."""
    need(OPEN_MPI, "Open MPI")
    result = run_kolorun(
        ["--mpi", "--verbose", "-np", "2", "--mpi-args=-x PROBE=from-mpi-args", "python", "-c",
         KOLORUN_MPI_RANK],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for rank in (0, 1):
        line = f"[1,{rank}]<stdout>:rank {rank} of 2, launcher rank {rank}, sum 3, probe "
        assert line + "from-mpi-args" in result.stdout, result.stdout
    command = result.stderr.splitlines()[0]
    assert command.startswith("kolorun: OpenMPI: mpirun --allow-run-as-root --tag-output"), command
    assert "-x KOLO_JOB_SECRET" in command and "-x PROBE=from-mpi-args" in command, command
    assert "kolorun: note" not in result.stderr, result.stderr
    failing = run_kolorun(
        ["--mpi", "-np", "2", "python", "-c",
         "import sys, kolo.torch as hvd; hvd.init(); sys.exit(3 if hvd.rank() == 1 else 0)"],
        timeout=120,
    )  # fmt: skip
    assert failing.returncode == 3, failing.stderr[-2000:]


def test_kolorun_mpi_without_mpi4py_meets_at_its_rendezvous_address(tmp_path) -> None:
    """MPICH's mpirun (mpi4py here is Open MPI's, so it sees a world of one): the ranks meet at
    the address and secret kolorun put in their environment, not on the command line."""
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(f'#!/bin/sh\nexec {need(MPICH, "MPICH")} "$@"\n')
    mpirun.chmod(0o755)
    path = f"{tmp_path}:{worker_env()['PATH']}"
    result = run_kolorun(
        ["--mpi", "--verbose", "-np", "2", "python", worker("mpi_env_worker.py")],
        timeout=120,
        env={"PATH": path},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stderr.startswith("kolorun: MPICH: mpirun -l -np 2 -hosts localhost -ppn 2")
    assert "KOLO_JOB_SECRET" not in result.stderr.splitlines()[0], result.stderr
    for rank in (0, 1):
        line = f"launcher rank {rank}: rank {rank} of 2, local {rank} of 2, sum 3"
        assert f"{line}, job vars left False" in result.stdout, result.stdout


def test_kolorun_mpi_without_mpirun_says_what_to_install() -> None:
    result = run_kolorun(["--mpi", "-np", "2", "python", "-c", "pass"], env={"PATH": str(BIN)})
    assert result.returncode == 2, result.stderr
    assert "no mpirun on PATH" in result.stderr and "openmpi-bin" in result.stderr, result.stderr


def test_kolorun_mpi_threads_disable_initializes_mpi_without_threads() -> None:
    """Horovod's HOROVOD_MPI_THREADS_DISABLE: MPI_Init instead of MPI_Init_thread(MULTIPLE)."""
    need(OPEN_MPI, "Open MPI")
    code = (
        "import kolo.torch as hvd; hvd.init(); from mpi4py import MPI; "
        "print('single' if MPI.Query_thread() == MPI.THREAD_SINGLE else 'threads')"
    )
    result = run_kolorun(
        ["--mpi", "--mpi-threads-disable", "-np", "2", "python", "-c", code], timeout=120
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("<stdout>:single") == 2, result.stdout
