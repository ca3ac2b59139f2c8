"""Joining and leaving the job: ``init`` and ``shutdown``, shared by every adapter.

They sit above both halves of the process state they manage: the engine and rank assignment
(``kolo._core``) and the process sets registered with it (``kolo.process_sets``).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from typing import Any, Callable

from kolo import _allocator, _core, _mpi_launch
from kolo import process_sets as _sets
from kolo._env import elastic_joining, elastic_launch

__all__ = ["init", "shutdown"]

_log = logging.getLogger("kolo")

#: What a framework adapter loads before a joining worker first registers (see
#: :func:`warm_before_joining`).
_join_warmups: list[Callable[[], None]] = []

#: True once this process registered with a job (the warm-ups run before the first time only).
_registered_once = False


def warm_before_joining(warmup: Callable[[], None]) -> None:
    """Registers ``warmup`` (a framework adapter's): a worker added to a running elastic job
    calls it once, before its first registration. The driver announces a new worker to the
    running ranks when it registers, and they wait for it from then on; what the framework
    loads lazily at the first step (torch's optimizers import ``torch._dynamo``) is loaded
    here instead, while the others still train. Errors are logged, not raised.

    Example::

        warm_before_joining(lambda: importlib.import_module("torch._dynamo"))
    """
    if warmup not in _join_warmups:
        _join_warmups.append(warmup)


def _warm_up_joining_worker() -> None:
    """Runs the adapters' warm-ups in a worker added to a running elastic job (once)."""
    if _registered_once or not elastic_joining():
        return
    for warmup in list(_join_warmups):
        started = time.monotonic()
        try:
            warmup()
        except Exception as error:  # a warm-up only saves time later
            _log.debug("warm-up before joining the job failed: %s", error)
        _log.debug("warm-up before joining the job: %.3f s", time.monotonic() - started)


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Joins the job this process was launched into, or runs as a single rank.

    Under ``kolorun`` (or ``kolo.spark.run`` / ``RayExecutor``) the process registers with the
    job's driver service, receives its rank (a host's ranks are consecutive) and connects to its
    peers. Started by ``mpirun`` (Open MPI, MPICH) or ``srun``, the ranks meet by themselves and
    keep their MPI rank (see docs/mpi.md). Launched bare (``python train.py``) it becomes rank 0
    of 1. Calling it again is a no-op; after :func:`shutdown` it joins the job again (every rank
    must): a fresh engine and connections, the same rank.

    ``comm``, as in Horovod: an mpi4py communicator (``MPI.COMM_WORLD`` or a sub-communicator:
    the job is that communicator's ranks, numbered as in it) or a list of ``COMM_WORLD`` ranks.
    ``process_sets``: :class:`~kolo.ProcessSet` objects to register, or ``"dynamic"``.

    Example::

        import kolo.torch as hvd
        hvd.init()
        print(hvd.rank(), hvd.size())

        from mpi4py import MPI
        hvd.init(comm=MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank % 2))  # two independent jobs
    """
    if process_sets == "dynamic":
        os.environ["KOLO_DYNAMIC_PROCESS_SETS"] = "1"
        process_sets = None
    _mpi_launch.check_comm(comm)
    if _core.is_initialized():
        return
    job_env = _mpi_launch.job_env(comm)
    os.environ.update(job_env or {})
    _warm_up_joining_worker()
    try:
        if not _core.start_engine():
            return
        _mpi_launch.check_assignment(_core.rank())
    except BaseException:
        _core.stop_engine()
        raise
    finally:
        _mpi_launch.forget_env_vars()
    global _registered_once
    _registered_once = True
    _allocator.keep_freed_memory()
    _refresh_elastic_rank_env()
    # Registered afresh at every init so it runs first at exit: before the exit hook of a job
    # driver this process hosts for mpirun/srun ranks (it waits for every rank to leave).
    atexit.unregister(shutdown)
    atexit.register(shutdown)
    global _init_process_sets
    _init_process_sets = list(process_sets or [])
    if elastic_launch():
        _sets.register_for_round(_init_process_sets)
        return
    for ps in _init_process_sets:
        _sets.register(ps, initializing=True)


#: The ``process_sets`` of the latest ``init``: an elastic reset registers them again.
_init_process_sets: list[Any] = []


def init_process_sets() -> list[Any]:
    """The ``process_sets`` the latest :func:`init` was given (an elastic reset passes them to
    the next one)."""
    return list(_init_process_sets)


#: The rank variables a launcher sets (``KOLO_*`` and ``HOROVOD_*``), by ``rank_info`` key.
_RANK_VARS = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")


def _refresh_elastic_rank_env() -> None:
    """In an elastic job (the launcher set ``KOLO_ELASTIC_TIMEOUT``), rewrites the rank
    variables in ``os.environ`` from this round's assignment, as Horovod's Gloo context does
    after an elastic reset: a rank's ``HOROVOD_RANK`` etc. never describe an older round."""
    if not elastic_launch():
        return
    for name in _RANK_VARS:
        value = str(_core._get(name))
        os.environ[f"KOLO_{name.upper()}"] = value
        os.environ[f"HOROVOD_{name.upper()}"] = value


def shutdown() -> None:
    """Leaves the job: closes connections to peers and the driver. ``init()`` may follow (on
    every rank); process sets must then be registered again.

    Example::

        hvd.shutdown()
        hvd.init()  # a fresh engine; hvd.rank() is the same as before
    """
    _core.stop_engine()
    _sets._forget_registrations()
