"""Ranks started by ``mpirun`` (Open MPI, MPICH) or ``srun``, and ``init(comm=...)``: how they
meet without kolorun (see docs/mpi.md).

With mpi4py, rank 0 of the job's communicator starts the job driver in its own process and the
driver's address and the job secret reach the other ranks by an MPI broadcast (never a command
line or a file). Without it, the launcher's variables (``OMPI_COMM_WORLD_*``, ``PMI_*``,
``SLURM_*``) give each process its rank and the job's size, the user gives the rendezvous
address (``MASTER_ADDR``/``MASTER_PORT`` as for torchrun, or ``KOLO_RENDEZVOUS_ADDR``) and the
secret (``KOLO_JOB_SECRET``, forwarded by name: ``mpirun -x KOLO_JOB_SECRET``), and launcher
rank 0 starts the driver on that address. Either way the job's rank is the MPI rank.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from kolo import _native
from kolo._env import seconds_from_env
from kolo._nics import interface_ip
from kolo.exceptions import ConfigError, InvalidValueError, RendezvousError, TimeoutError

log = logging.getLogger("kolo")

#: How long rank 0 keeps the job driver up at exit for the other ranks to leave.
DRIVER_LINGER_S = 60.0
_PAYLOAD_BYTES = 1024
# The variables naming the job (the secret among them), removed from os.environ once joined.
_JOB_VARS = (
    "KOLO_DRIVER_ADDR",
    "KOLO_JOB_SECRET",
    "KOLO_JOB_ID",
    "KOLO_TASK_INDEX",
    "KOLO_NUM_TASKS",
)
_SECRET_HINT = (
    "export KOLO_JOB_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))') "
    "before mpirun/srun (mpirun -x KOLO_JOB_SECRET forwards it by name; srun forwards the "
    "environment)"
)


@dataclass(frozen=True)
class LauncherRank:
    """This process's place as the MPI or Slurm launcher that started it says."""

    launcher: str
    rank: int
    size: int


def launcher_rank(environ: Mapping[str, str] = os.environ) -> Optional[LauncherRank]:
    """The rank and size ``mpirun`` (Open MPI, MPICH/Hydra) or ``srun`` gave this process, or
    None when neither started it.

    Example::

        launcher_rank({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
        # LauncherRank(launcher='mpirun (Open MPI)', rank=1, size=2)
    """
    if "OMPI_COMM_WORLD_RANK" in environ:
        return _parsed(environ, "mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
    if "PMI_RANK" in environ:
        return _parsed(environ, "mpirun (MPICH)", "PMI_RANK", "PMI_SIZE")
    # srun sets SLURM_STEP_ID; a batch script (one process) has SLURM_PROCID but no step.
    if "SLURM_PROCID" in environ and ("SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ):
        size_var = next(
            (
                name
                for name in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
                if name in environ
            ),
            "SLURM_NTASKS",
        )
        return _parsed(environ, "srun (Slurm)", "SLURM_PROCID", size_var)
    return None


def _parsed(
    environ: Mapping[str, str], launcher: str, rank_var: str, size_var: str
) -> LauncherRank:
    values = []
    for name in (rank_var, size_var):
        text = environ.get(name, "")
        try:
            values.append(int(text))
        except ValueError:
            raise ConfigError(
                f"{launcher} started this process, but {name}={text!r} is not a number "
                f"(kolo reads {rank_var} and {size_var} to join the job)"
            ) from None
    rank, size = values
    if not 0 <= rank < size:
        raise ConfigError(f"{launcher}: {rank_var}={rank} is out of range for {size_var}={size}")
    return LauncherRank(launcher, rank, size)


@dataclass
class _Job:
    """The job this process joined through MPI or Slurm, kept for ``init`` after ``shutdown``."""

    source: Any  # the init(comm=...) argument, or None
    how: str  # how the ranks met, for messages
    rank: int  # the rank this process must get (the MPI rank)
    env: dict[str, str]  # the KOLO_* variables it joins with (the secret among them)
    comm: Any = None  # the job's mpi4py communicator, if any
    driver: Any = None  # the job driver, on the job's rank 0


_job: Optional[_Job] = None


def job_env(comm: Any) -> Optional[dict[str, str]]:
    """The ``KOLO_*`` variables this process joins its job with: for ``init(comm=...)``, or a
    process started by ``mpirun``/``srun``; None when neither (kolorun, Spark, Ray, a bare
    ``python train.py``) or when the job has one rank. Rank 0 starts the job driver here.

    Example::

        env = job_env(None)  # under `mpirun -np 2`: {"KOLO_DRIVER_ADDR": ..., ...}
    """
    global _job
    check_comm(comm)
    ranks = list(comm) if isinstance(comm, (list, tuple, range)) else None
    if ranks == []:  # Horovod: an empty list means COMM_WORLD
        comm = ranks = None
    if os.environ.get("KOLO_DRIVER_ADDR"):
        if comm is not None:
            log.warning("init(comm=...) is ignored: this process was started by a kolo launcher")
        return None
    if _job is not None and (comm is None or comm is _job.source):
        return dict(_job.env)
    if comm is not None:
        _job = _start_for_comm(comm, ranks)
    else:
        launched = launcher_rank()
        if launched is None or launched.size == 1:
            return None
        _job = _start_launched(launched)
    return None if _job is None else dict(_job.env)


def check_comm(comm: Any) -> None:
    """An :class:`InvalidValueError` (a ``ValueError``, as Horovod raises) unless ``comm`` is
    None, a list of ranks or an mpi4py communicator.

    Example::

        check_comm(MPI.COMM_WORLD)
    """
    if comm is None or isinstance(comm, (list, tuple, range)):
        return
    from_mpi4py = type(comm).__module__.split(".")[0] == "mpi4py"  # then it is imported already
    mpi = _mpi4py() if from_mpi4py else None
    if mpi is None or not isinstance(comm, mpi.Comm):
        raise InvalidValueError(
            "Invalid type of argument comm: expected a list of COMM_WORLD ranks or an "
            f"mpi4py.MPI.Comm, got {type(comm).__name__}"
        )


def _start_launched(launched: LauncherRank) -> Optional[_Job]:
    """A process ``mpirun``/``srun`` started: over mpi4py's COMM_WORLD when it is the
    launcher's world, else from the environment."""
    timeout = _start_timeout()
    mpi = _mpi4py()
    if mpi is not None and mpi.COMM_WORLD.Get_size() == launched.size:
        return _start_over_mpi(None, mpi.COMM_WORLD, f"{launched.launcher} with mpi4py", timeout)
    if mpi is not None:
        log.warning(
            "%s started %d ranks, but mpi4py's COMM_WORLD has %d (mpi4py was built for another "
            "MPI): meeting through MASTER_ADDR/MASTER_PORT instead",
            launched.launcher,
            launched.size,
            mpi.COMM_WORLD.Get_size(),
        )
    return _start_from_env(launched, timeout)


def _start_for_comm(comm: Any, ranks: Optional[list[int]]) -> Optional[_Job]:
    """``init(comm=...)``: the communicator's ranks, or the listed ``COMM_WORLD`` ranks."""
    timeout = _start_timeout()
    mpi = _mpi4py()
    if mpi is None:
        raise ConfigError(
            f"init(comm={comm!r}) needs mpi4py to reach the other ranks: pip install mpi4py"
        )
    if ranks is None:
        return _start_over_mpi(comm, comm, "init(comm=...)", timeout)
    world = mpi.COMM_WORLD
    _check_rank_list(ranks, world.Get_size(), world.Get_rank())
    group = world.Get_group().Incl(ranks)
    try:
        sub = world.Create_group(group)  # only the listed ranks take part
    finally:
        group.Free()
    return _start_over_mpi(comm, sub, f"init(comm={ranks})", timeout)


def _check_rank_list(ranks: list[Any], world_size: int, world_rank: int) -> None:
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise InvalidValueError(f"init(comm={ranks!r}): the list must hold COMM_WORLD ranks (ints)")
    if len(set(ranks)) != len(ranks) or not all(0 <= r < world_size for r in ranks):
        raise InvalidValueError(
            f"init(comm={ranks!r}): the ranks must be distinct COMM_WORLD ranks in "
            f"0..{world_size - 1}"
        )
    if world_rank not in ranks:
        raise InvalidValueError(
            f"init(comm={ranks!r}): this process is COMM_WORLD rank {world_rank}, which is not "
            "in the list; only the listed ranks call init"
        )


def _start_over_mpi(source: Any, comm: Any, how: str, timeout: float) -> Optional[_Job]:
    """Rank 0 of ``comm`` starts the driver; the address and secret reach the rest by an MPI
    broadcast with a deadline."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return None
    driver = None
    message: dict[str, Any] = {}
    failure: Optional[BaseException] = None
    if rank == 0:
        try:
            ip = _advertised_ip()
            driver = _native.LaunchDriver(size, f"{ip}:0", timeout)
            vars0 = dict(driver.worker_env(0))
            message = {
                "addr": f"{ip}:{driver.addr.rsplit(':', 1)[1]}",
                "secret": vars0["KOLO_JOB_SECRET"],
                "job_id": vars0["KOLO_JOB_ID"],
            }
        except Exception as error:  # every rank must hear of it, or the others would wait
            failure = error
            message = {"error": f"{type(error).__name__}: {error}"[:400]}
    message = _broadcast(comm, message, timeout, how)
    if failure is not None:
        raise failure
    if "error" in message:
        raise RendezvousError(f"{how}: rank 0 could not start the job driver: {message['error']}")
    env = _worker_env(message["addr"], message["secret"], message["job_id"], rank, size, timeout)
    return _remember(_Job(source, how, rank, env, comm, driver))


def _broadcast(comm: Any, message: dict[str, Any], timeout: float, how: str) -> dict[str, Any]:
    """``message`` from rank 0 to every rank of ``comm`` (a fixed-size non-blocking broadcast,
    so a rank that never arrives fails the wait after ``timeout`` seconds)."""
    mpi = _mpi4py()
    assert mpi is not None
    buffer = bytearray(_PAYLOAD_BYTES)
    if comm.Get_rank() == 0:
        data = json.dumps(message).encode()
        buffer[: len(data)] = data
    request = comm.Ibcast([buffer, mpi.BYTE], root=0)
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{how}: rank 0 did not send the job driver's address within {timeout:g}s "
                "(KOLO_START_TIMEOUT); every rank must call hvd.init()"
            )
        time.sleep(0.001)
    return json.loads(bytes(buffer).rstrip(b"\0"))


def _start_from_env(launched: LauncherRank, timeout: float) -> _Job:
    """Without mpi4py: the address and secret from the environment; launcher rank 0 binds the
    driver on the rendezvous port."""
    host, port = _rendezvous_addr(launched)
    secret = os.environ.get("KOLO_JOB_SECRET", "").strip()
    if not secret:
        raise ConfigError(
            f"{launched.launcher} started this process as rank {launched.rank} of "
            f"{launched.size} without mpi4py for this MPI (not installed, or built for another), "
            f"so kolo needs the job secret from the environment: {_SECRET_HINT}; or pip "
            "install mpi4py"
        )
    try:
        key = bytes.fromhex(secret)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(f"KOLO_JOB_SECRET must be 64 hex digits: {_SECRET_HINT}")
    try:
        ip = socket.gethostbyname(host)
    except OSError as error:
        raise ConfigError(f"the rendezvous host {host!r} does not resolve: {error}") from None
    addr = f"{ip}:{port}"
    job_id = hashlib.sha256(b"kolo job id\0" + key + addr.encode()).hexdigest()[:32]
    driver = None
    if launched.rank == 0:
        bind_ip = _interface_setting() or "0.0.0.0"
        try:
            driver = _native.LaunchDriver(
                launched.size, f"{bind_ip}:{port}", timeout, secret=secret, job_id=job_id
            )
        except Exception as error:
            raise RendezvousError(
                f"rank 0 could not start the job driver on {bind_ip}:{port} (MASTER_PORT): "
                f"{error}; pick a free port"
            ) from None
    env = _worker_env(addr, secret, job_id, launched.rank, launched.size, timeout)
    how = f"{launched.launcher} with the rendezvous address {addr}"
    return _remember(_Job(None, how, launched.rank, env, None, driver))


def _rendezvous_addr(launched: LauncherRank) -> tuple[str, int]:
    combined = os.environ.get("KOLO_RENDEZVOUS_ADDR", "").strip()
    if combined:
        host, _, port_text = combined.rpartition(":")
        name = "KOLO_RENDEZVOUS_ADDR"
    else:
        host = os.environ.get("MASTER_ADDR", "").strip()
        port_text = os.environ.get("MASTER_PORT", "").strip()
        name = "MASTER_PORT"
        if not host or not port_text:
            missing = [n for n, v in (("MASTER_ADDR", host), ("MASTER_PORT", port_text)) if not v]
            verb = "is" if len(missing) == 1 else "are"
            raise ConfigError(
                f"{launched.launcher} started this process as rank {launched.rank} of "
                f"{launched.size} without mpi4py for this MPI (not installed, or built for "
                f"another), so kolo needs a rendezvous address: {' and '.join(missing)} {verb} "
                "not set. Set MASTER_ADDR (the host of rank 0) and "
                "MASTER_PORT (a free port there), or KOLO_RENDEZVOUS_ADDR=host:port, and "
                f"KOLO_JOB_SECRET ({_SECRET_HINT}); or pip install mpi4py"
            )
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
        raise ConfigError(f"{name}: {combined or port_text!r} is not a usable host:port / port")
    return host, int(port_text)


def _worker_env(
    addr: str, secret: str, job_id: str, rank: int, size: int, timeout: float
) -> dict[str, str]:
    env = {
        "KOLO_DRIVER_ADDR": addr,
        "KOLO_JOB_SECRET": secret,
        "KOLO_JOB_ID": job_id,
        "KOLO_TASK_INDEX": str(rank),
        "KOLO_NUM_TASKS": str(size),
        "KOLO_START_TIMEOUT": f"{timeout:g}",
    }
    iface = os.environ.get("HOROVOD_GLOO_IFACE", "").strip()
    if iface and not os.environ.get("KOLO_DATA_ADDR"):
        env["KOLO_DATA_ADDR"] = iface
    return env


def _remember(job: _Job) -> _Job:
    if job.driver is not None:
        atexit.register(_close_driver, job.driver)
    return job


def _close_driver(driver: Any) -> None:
    """At rank 0's exit: keeps the driver up until the other ranks left (bounded)."""
    deadline = time.monotonic() + DRIVER_LINGER_S
    while driver.active_ranks() > 0 and driver.failure() is None:
        if time.monotonic() > deadline:
            log.warning(
                "%d rank(s) still in the job %gs after rank 0 finished; stopping its driver",
                driver.active_ranks(),
                DRIVER_LINGER_S,
            )
            break
        time.sleep(0.01)
    driver.shutdown()


def check_assignment(rank: int) -> None:
    """After joining: the job's rank must be the MPI rank. kolo numbers each host's ranks
    consecutively, so a launch that interleaves hosts (``--map-by node``, ``srun -m cyclic``)
    cannot keep MPI's numbering: a :class:`ConfigError` (and rank 0 aborts the job, so no rank
    waits for it).

    Example::

        check_assignment(hvd.rank())
    """
    job = _job
    if job is None or os.environ.get("KOLO_DRIVER_ADDR") != job.env["KOLO_DRIVER_ADDR"]:
        return
    advice = (
        f"{job.how}: kolo gives each host's ranks consecutive numbers (hosts in the order of "
        "their lowest rank), and this launch interleaves hosts; start the ranks host by host "
        "(mpirun --map-by slot, the default; srun --distribution=block, the default)"
    )
    if job.driver is not None:
        rows = job.driver.assignment() or []
        moved = [row for row in rows if row["rank"] != row["task_index"]]
        if moved:
            first = f"{advice}: MPI rank {moved[0]['task_index']} got rank {moved[0]['rank']}"
            job.driver.abort(first)
            raise ConfigError(first)
    if rank != job.rank:
        raise ConfigError(f"{advice}: MPI rank {job.rank} got rank {rank}")


def forget_env_vars() -> None:
    """Removes the job's variables (the secret among them) from ``os.environ`` once joined, so
    child processes do not inherit them; ``init`` after ``shutdown`` sets them again."""
    if _job is not None and os.environ.get("KOLO_DRIVER_ADDR") == _job.env["KOLO_DRIVER_ADDR"]:
        for name in _JOB_VARS:
            os.environ.pop(name, None)


def job_comm() -> Any:
    """The mpi4py communicator of the job (ranks numbered as kolo's), or None when the ranks
    did not meet over MPI."""
    return None if _job is None else _job.comm


def comm_process_sets(
    comm: Any, timeout: Optional[float] = None
) -> tuple[list[int], list[list[int]]]:
    """For a process set built from an mpi4py communicator: this process's set (``comm``'s
    ranks as job ranks) and every set the job's ranks passed (they may pass different
    communicators, e.g. the halves of ``COMM_WORLD.Split``), sorted; every rank must call it.

    Example::

        mine, every_set = comm_process_sets(MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank % 2))
    """
    mpi = _mpi4py()
    job = job_comm()
    if job is None or mpi is None:
        raise InvalidValueError(
            "a ProcessSet built from an MPI communicator needs a job whose ranks met over MPI "
            "(started by mpirun/srun with mpi4py installed, or hvd.init(comm=...))"
        )
    if comm == mpi.COMM_NULL:
        raise InvalidValueError("ProcessSet(MPI.COMM_NULL): pass the communicator this rank is in")
    size = job.Get_size()
    mine = mpi.Group.Translate_ranks(
        comm.Get_group(), list(range(comm.Get_size())), job.Get_group()
    )
    if any(r == mpi.UNDEFINED for r in mine):
        raise InvalidValueError(
            "the ProcessSet's communicator has ranks outside the job's communicator"
        )
    membership = bytearray(size)
    for r in mine:
        membership[r] = 1
    gathered = bytearray(size * size)
    request = job.Iallgather([membership, mpi.BYTE], [gathered, mpi.BYTE])
    wait = _start_timeout() if timeout is None else timeout
    deadline = time.monotonic() + wait
    while not request.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"ProcessSet(comm): not every rank registered its communicator's set within "
                f"{wait:g}s (KOLO_START_TIMEOUT); every rank must pass one"
            )
        time.sleep(0.001)
    every = {tuple(j for j in range(size) if gathered[i * size + j]) for i in range(size)}
    return sorted(mine), [list(s) for s in sorted(every)]


def _mpi4py() -> Any:
    """mpi4py's ``MPI`` module (importing it initializes MPI), or None when not installed."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    import mpi4py

    # Horovod's HOROVOD_MPI_THREADS_DISABLE (kolorun --mpi-threads-disable): MPI_Init without
    # thread support.
    threads_off = os.environ.get("HOROVOD_MPI_THREADS_DISABLE", "").strip().lower()
    if threads_off in ("1", "true", "yes", "on"):
        mpi4py.rc.threads = False
    from mpi4py import MPI

    return MPI


def _start_timeout() -> float:
    return seconds_from_env("KOLO_START_TIMEOUT", 30.0)


def _interface_setting() -> Optional[str]:
    """The IP of ``KOLO_DATA_ADDR`` / ``HOROVOD_GLOO_IFACE`` (an interface name or an IP)."""
    for name in ("KOLO_DATA_ADDR", "HOROVOD_GLOO_IFACE"):
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        try:
            socket.inet_aton(value)
            return value
        except OSError:
            ip = interface_ip(value)
            if ip is None:
                raise ConfigError(
                    f"{name}={value!r}: no such network interface with an IPv4 address on "
                    "this host (use a name `ip addr` lists, e.g. eth0, or an IP)"
                ) from None
            return ip
    return None


def _advertised_ip() -> str:
    """The address rank 0's driver listens on and every rank dials: the interface setting, else
    the host name's address when it is not a loopback one, else the source address of the
    default route, else 127.0.0.1 (one host)."""
    configured = _interface_setting()
    if configured:
        return configured
    try:
        ip = socket.gethostbyname(socket.gethostname())
        if not ip.startswith("127."):
            return ip
    except OSError:
        pass
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # a documentation address: connect() sends nothing
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
