"""Framework-agnostic process state shared by every adapter (``kolo.torch``, ``kolo.keras``).

Holds the rank assignment while the engine runs (``init``/``shutdown`` in ``kolo._lifecycle``
start and stop it) and names unnamed collectives deterministically, so the same call sequence
gets the same names on every rank.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import itertools
import os
import threading
import warnings
from typing import Any, Iterator, Optional

from kolo import _native
from kolo.exceptions import InvalidArgumentError, NotInitializedError, NotSupportedError

_lock = threading.Lock()
_info: Optional[dict[str, Any]] = None
_counters: dict[str, itertools.count] = {}


def start_engine() -> bool:
    """Starts this process's engine and takes its rank assignment (see ``kolo._lifecycle.init``);
    False when it already runs. Unnamed ops are counted afresh.

    Example::

        if _core.start_engine():
            ...  # first start since the last stop_engine()
    """
    global _info
    with _lock:
        if _info is not None:
            return False
        _native.init()
        _info = _native.rank_info()
        _counters.clear()
        return True


def stop_engine() -> None:
    """Stops this process's engine and forgets its rank assignment (see
    ``kolo._lifecycle.shutdown``).

    Example::

        _core.stop_engine()
        assert not _core.is_initialized()
    """
    global _info
    with _lock:
        _native.shutdown()
        _info = None


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _info is not None


def _get(key: str) -> Any:
    info = _info
    if info is None:
        raise NotInitializedError("kolo has not been initialized; call hvd.init() first")
    return info[key]


def require_initialized() -> None:
    """Raises :class:`~kolo.exceptions.NotInitializedError` unless :func:`init` ran."""
    _get("rank")


def rank() -> int:
    """This process's rank in the job, 0 ≤ rank < size."""
    return int(_get("rank"))


def size() -> int:
    """The number of ranks in the job."""
    return int(_get("size"))


def local_rank() -> int:
    """This process's position among the ranks on its host (the GPU index to use)."""
    return int(_get("local_rank"))


def local_size() -> int:
    """The number of ranks on this process's host."""
    return int(_get("local_size"))


def cross_rank() -> int:
    """The ordinal of this host among the hosts that have a rank with this local rank."""
    return int(_get("cross_rank"))


def cross_size() -> int:
    """The number of hosts that have a rank with this process's local rank."""
    return int(_get("cross_size"))


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return bool(_get("is_homogeneous"))


def op_name(kind: str, name: Optional[str]) -> str:
    """The name an op carries across ranks: the user's, or ``<kind>.noname.<n>``."""
    if name is not None:
        return str(name)
    with _lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}.noname.{next(counter)}"


@contextlib.contextmanager
def submitted_together() -> Iterator[None]:
    """Every op this thread submits in the block is handed to the engine at once when the block
    ends, so a group (Horovod's grouped ops, a gradient tape's gradients) enters one cycle on
    every rank and fuses; when the block raises, none of them is submitted.

    Example::

        with _core.submitted_together():
            handles = [_native.submit(...) for t in tensors]
    """
    _native.begin_group()
    try:
        yield
    except BaseException:
        _native.cancel_group()
        raise
    _native.end_group()


def engine_stats() -> dict[str, int]:
    """The engine's counters since ``init``: ``cycles``, ``tensors`` (completed),
    ``collectives`` (run on the data plane; a fused allreduce counts once), ``shm_collectives``
    (those run on a shared-memory data plane, flat or hierarchical; never Adasum, which runs
    over TCP), ``fused_tensors``,
    ``cache_hits`` / ``cache_misses`` (tensors agreed through the response cache / in full),
    ``negotiation_ns`` and ``negotiated_tensors``, and ``connections_opened`` /
    ``connections_open`` (the data-plane TCP connections this rank made since ``init`` and
    holds now: with ``KOLO_CONNECT=lazy``, the default, only those to the peers its
    collectives used so far; with ``KOLO_CONNECT=eager``, ``size - 1`` from the start);
    what started this rank's cycles (``cycles_by_caller``, ``cycles_submitted``,
    ``cycles_peer_waiting``, ``cycles_peer_grace``, ``cycles_cycle_time``, ``cycles_recheck``,
    ``cycles_at_start``), ``cycles_undecided`` (cycles that decided nothing),
    ``engine_wakeups``, ``engine_wakeups_by_peers`` and ``engine_deferrals`` (docs/engine.md,
    "Counters").

    Example::

        before = kolo.engine_stats()["collectives"]
    """
    require_initialized()
    return {str(k): int(v) for k, v in _native.engine_stats().items()}


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome-trace timeline to ``file_path`` (rank 0 writes it; open it in
    https://ui.perfetto.dev). ``mark_cycles`` adds an event per engine cycle.

    Example::

        hvd.start_timeline("/tmp/timeline.json")
    """
    require_initialized()
    _native.start_timeline(os.fspath(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stops the timeline and completes its file.

    Example::

        hvd.stop_timeline()
    """
    require_initialized()
    _native.stop_timeline()


def mpi_built() -> bool:
    """Whether ``init(comm=...)`` and ``ProcessSet(comm)`` work: True when mpi4py is installed
    (kolo needs no MPI build; ranks started by ``mpirun``/``srun`` join without it too). See
    docs/mpi.md for why each of these answers is what it is.

    Example::

        if hvd.mpi_built():
            hvd.init(comm=MPI.COMM_WORLD)
    """
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    """False: kolo's collectives never run over MPI (mpi4py only carries the rendezvous), so
    Horovod code paths that test ``mpi_enabled()`` before Adasum skip it (kolo runs Adasum
    on its own transport: ``op=hvd.Adasum`` works without MPI).

    Example::

        if not hvd.mpi_enabled():
            print("collectives run on kolo's own transport")
    """
    return False


def mpi_threads_supported() -> bool:
    """True: mixing mpi4py calls with kolo collectives is safe from any thread, because kolo's
    background thread never calls MPI (what Horovod asks MPI_THREAD_MULTIPLE for).

    Example::

        assert hvd.mpi_threads_supported()
    """
    return True


def gloo_built() -> bool:
    """True: kolo's own TCP/shared-memory transport fills Gloo's role (the controller and
    CPU collectives that need no MPI), so Gloo-only paths (elastic, Spark/Ray) are taken.

    Example::

        assert hvd.gloo_built()
    """
    return True


def gloo_enabled() -> bool:
    """Whether the Gloo-role transport runs: True between ``init`` and ``shutdown``.

    Example::

        hvd.init()
        assert hvd.gloo_enabled()
    """
    return is_initialized()


def nccl_built() -> int:
    """NCCL's version code (Horovod's ``NCCL_VERSION_CODE``, e.g. 21803 for 2.18.3) when this
    build can run NCCL collectives (it loads libnccl at run time), else 0.

    Example::

        if hvd.nccl_built() >= 2700:
            ...
    """
    version = _native.cuda_probe().get("nccl_version")
    if not _native.build_info()["nccl"] or not version:
        return 0
    major, minor, patch = (int(p) for p in str(version).split(".")[:3])
    # NCCL's own NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z before 2.9, X*10000 + Y*100 + Z since.
    return major * (1000 if (major, minor) < (2, 9) else 10000) + minor * 100 + patch


def cuda_built() -> bool:
    """Whether this build was compiled with CUDA support."""
    return bool(_native.build_info()["cuda"])


def rocm_built() -> bool:
    """False: kolo has no ROCm support."""
    return False


def ddl_built() -> bool:
    """False: kolo has no IBM DDL support."""
    return False


def ccl_built() -> bool:
    """False: kolo has no oneCCL support."""
    return False


class ReduceOp(enum.IntEnum):
    """Reduction operations, with Horovod's values (``hvd.Average``, ``hvd.Sum``, ...)."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


#: Reduce by averaging over the ranks (Horovod's ``hvd.Average``, the default).
Average = ReduceOp.Average
#: Reduce by summing over the ranks.
Sum = ReduceOp.Sum
#: Horovod's Adasum reduction: float tensors combined pairwise over a power-of-two number of
#: ranks (see :func:`check_adasum`).
Adasum = ReduceOp.Adasum
#: Reduce by the element-wise minimum over the ranks.
Min = ReduceOp.Min
#: Reduce by the element-wise maximum over the ranks.
Max = ReduceOp.Max
#: Reduce by the element-wise product over the ranks.
Product = ReduceOp.Product


def resolve_op(op: Any, average: Optional[bool]) -> ReduceOp:
    """Horovod's rule: ``op`` wins, the deprecated ``average`` flag maps to Average/Sum,
    and the default is Average."""
    if average is None and type(op) is ReduceOp:
        return op  # the common case, first: it is on every collective's path
    if op is not None and average is not None:
        raise InvalidArgumentError(
            "pass either op= or the deprecated average=, not both (op supersedes average)"
        )
    if average is not None:
        warnings.warn(
            "average= is deprecated; use op=hvd.Average or op=hvd.Sum",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    if op is None:
        return Average
    try:
        resolved = ReduceOp(op)
    except ValueError:
        raise InvalidArgumentError(
            f"unknown reduction op {op!r}; use hvd.Sum, hvd.Average, hvd.Min, hvd.Max, "
            "hvd.Product or hvd.Adasum"
        ) from None
    return resolved


def check_adasum(size: int) -> None:
    """Raises :class:`NotSupportedError` (a ``NotImplementedError``, as Horovod raises) unless
    Adasum can run on a process set of ``size`` ranks: a power of two (1, 2, 4, 8, ...).
    Every rank of the set raises it at the call, so no rank waits for the others.

    Example::

        if op is hvd.Adasum:
            _core.check_adasum(process_set.size())
    """
    if size < 1 or size & (size - 1):
        raise NotSupportedError(
            f"Running Adasum with non-power of 2 ranks is not supported yet: the process set "
            f"has {size} ranks; run on 1, 2, 4, 8, ... ranks (or a process set of that size), "
            "or use op=hvd.Average or op=hvd.Sum"
        )


def host_updates() -> list[tuple[float, int]]:
    """Drains the host updates of an elastic job that reached this worker since the last call.

    Each is Horovod's ``HostsUpdated`` notification: ``(timestamp, result)`` with the time the
    job driver recorded it (seconds since the epoch) and a ``HostUpdateResult`` value (1:
    removed, 2: added, 3: mixed), oldest first. The driver sends every worker the updates made
    after its registration round completed; at most 1,024 are kept (older ones merge). Empty
    when kolo is not initialized, for a fixed-size job, and for a single process.

    Example::

        for timestamp, result in _core.host_updates():
            if result & 2:  # HostUpdateResult.added
                ...  # new workers wait to join: reset at the next commit
    """
    return [(float(timestamp), int(result)) for timestamp, result in _native.host_updates()]


def check_host_updates(timeout: float = 60.0) -> Optional[tuple[float, bool]]:
    """Elastic jobs: whether this commit raises ``HostsUpdatedInterrupt``, as
    ``(timestamp of the newest host update, skip_sync)``, or None.

    Every rank gets the same answer without a collective: rank 0's view of the host updates
    travels in the engine's cycle messages, and the answer is the view of the latest cycle that
    decided one of the global collectives submitted before this call (waiting up to
    ``timeout`` seconds for them). An update is raised once. None when kolo is not initialized.

    Example::

        raised = _core.check_host_updates()
        if raised is not None:
            raise HostsUpdatedInterrupt(skip_sync=raised[1])
    """
    raised = _native.check_host_updates(timeout)
    return None if raised is None else (float(raised[0]), bool(raised[1]))


def record_host_update(timestamp: float, result: int) -> None:
    """Elastic jobs: records a host update (``HostUpdateResult``: 1 removed, 2 added, 3 mixed)
    this process learned of, as the driver's notices are recorded; rank 0's records decide the
    commits of every rank (:func:`check_host_updates`)."""
    _native.record_host_update(float(timestamp), int(result))


def holds(handle: int) -> bool:
    """Whether the engine still holds the tensor submitted with ``handle``: from the submit call
    until ``wait`` consumed its result (so an interrupt in between cannot free it)."""
    return bool(_native.holds(handle))
