"""Process sets: collectives among a subset of the ranks (Horovod's ``hvd.ProcessSet``).

Every rank registers the same sets in the same order, either at ``init(process_sets=[...])``
or, with ``KOLO_DYNAMIC_PROCESS_SETS=1``, later through :func:`add_process_set`. Ops take
``process_set=`` and then run only among its members; disjoint sets run concurrently.

Example::

    evens = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[evens])
    if evens.included():
        total = hvd.allreduce(x, op=hvd.Sum, process_set=evens)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from numbers import Integral
from typing import Any, Optional, Union

from kolo import _core, _mpi_launch, _native
from kolo._env import seconds_from_env
from kolo.exceptions import InvalidArgumentError, InvalidValueError, TimeoutError

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


class ProcessSet:
    """A set of global ranks that runs collectives among themselves: a list of ranks, or an
    mpi4py communicator (as in Horovod; its ranks are translated to the job's ranks when the
    set is registered, and every rank must then pass one, e.g. its half of a ``Split``).

    Example::

        ps = hvd.ProcessSet([0, 1])
        evens_or_odds = hvd.ProcessSet(MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank % 2))
    """

    def __init__(self, ranks_or_comm: Union[Iterable[int], Any]) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm: Any = None
        if isinstance(ranks_or_comm, Iterable) and not isinstance(ranks_or_comm, (str, bytes)):
            ranks = list(ranks_or_comm)
            if not all(isinstance(r, Integral) and not isinstance(r, bool) for r in ranks):
                raise InvalidValueError(
                    "ProcessSet should be initialized with a list of process ranks or an mpi4py "
                    f"Comm object, got {ranks!r}"
                )
            self.ranks: Optional[list[int]] = sorted(int(r) for r in ranks)
            return
        if type(ranks_or_comm).__module__.split(".")[0] != "mpi4py":
            raise InvalidValueError(
                "ProcessSet should be initialized with a list of process ranks or an mpi4py "
                f"Comm object, got {type(ranks_or_comm).__name__}"
            )
        self.ranks = None  # known once registered
        self.mpi_comm = ranks_or_comm

    def _registered(self) -> bool:
        return self.process_set_id is not None and _core.is_initialized()

    def size(self) -> Optional[int]:
        """Number of ranks in the set, or None before it is registered."""
        return len(self.ranks) if self._registered() else None

    def rank(self) -> Optional[int]:
        """This process's rank within the set (-1 if it is not a member), or None before the
        set is registered."""
        if not self._registered():
            return None
        me = _core.rank()
        ranks = self.ranks or []
        return ranks.index(me) if me in ranks else -1

    def included(self) -> Optional[bool]:
        """Whether this process is a member, or None before the set is registered."""
        if not self._registered():
            return None
        return _core.rank() in (self.ranks or [])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessSet):
            return False
        if self.ranks is None or other.ranks is None:
            return self is other
        return self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks)) if self.ranks is not None else id(self)

    def __repr__(self) -> str:
        comm = "" if self.mpi_comm is None else f", mpi_comm={self.mpi_comm}"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}{comm})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0)."""

    def __init__(self) -> None:
        super().__init__([])
        self.process_set_id = 0

    @property  # type: ignore[override]
    def ranks(self) -> list[int]:
        return list(range(_core.size())) if _core.is_initialized() else []

    @ranks.setter
    def ranks(self, value: list[int]) -> None:
        """The global set always holds every rank; assignments are ignored."""

    def __repr__(self) -> str:
        return "global_process_set"


#: Every rank of the job (Horovod's ``hvd.global_process_set``), the default of every op.
global_process_set: ProcessSet = _GlobalProcessSet()

# Sets registered since init (by object identity: equal sets may be distinct objects), so
# shutdown can forget their ids (the next init starts afresh).
_live_sets: weakref.WeakValueDictionary[int, ProcessSet] = weakref.WeakValueDictionary()


def _forget_registrations() -> None:
    """Marks every registered set unregistered (called by ``shutdown``): after the next
    ``init`` they can be registered again, e.g. with ``init(process_sets=[...])``."""
    for ps in list(_live_sets.values()):
        ps.process_set_id = None
        if ps.mpi_comm is not None:
            ps.ranks = None  # translated afresh at the next registration
    _live_sets.clear()


def resolve(process_set: Any) -> ProcessSet:
    """The registered set for an op's ``process_set=`` argument (None: the global set)."""
    if process_set is None:
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(
            f"process_set must be a kolo.ProcessSet, got {type(process_set).__name__}"
        )
    if process_set.process_set_id is None:
        left_out = getattr(process_set, "_left_out", None)
        if left_out:
            raise InvalidArgumentError(
                f"{process_set!r} is not registered in this round of the elastic job: "
                f"{left_out}; check included() before using it, or build sets from hvd.size()"
            )
        raise InvalidArgumentError(
            f"{process_set!r} is not registered; pass it to init(process_sets=[...]) or to "
            "add_process_set() first"
        )
    return process_set


def _as_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    return process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)


def register(process_set: Union[ProcessSet, Iterable[int]], initializing: bool) -> ProcessSet:
    """Registers a set on every rank (all ranks must call this alike, in the same order). A set
    built from a communicator registers every set the ranks' communicators form (in sorted
    order, the same on every rank) and becomes the one holding this rank."""
    ps = _as_set(process_set)
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"{ps!r} is already registered")
    if ps.ranks is not None:
        return _register_ranks(ps, initializing)
    mine, every_set = _mpi_launch.comm_process_sets(ps.mpi_comm)
    for ranks in every_set:
        if ranks == mine:
            ps.ranks = ranks
            _register_ranks(ps, initializing)
        else:
            _register_ranks(ProcessSet(ranks), initializing)
    return ps


def register_for_round(process_sets: Iterable[Union[ProcessSet, Iterable[int]]]) -> None:
    """Elastic jobs: registers the ``init(process_sets=...)`` sets that fit this round, each
    under id 1, 2, ... by its position in the list, so a set keeps its id across resets even
    when an earlier one stops fitting. A set with a rank beyond this round's size stays
    unregistered (``included()`` is None; an op on it says why) until a round is big enough.
    Every rank (survivors after a reset, and new workers at their first ``init``) registers the
    same list, so they agree."""
    size = _core.size()
    for position, entry in enumerate(process_sets, start=1):
        ps = _as_set(entry)
        if ps.ranks is None:
            raise InvalidArgumentError(
                f"{ps!r}: an elastic job's process sets are lists of ranks (a communicator's "
                "ranks do not survive a reset); pass hvd.ProcessSet([...])"
            )
        if ps.process_set_id is not None:
            raise InvalidArgumentError(f"{ps!r} is already registered")
        if ps.ranks and ps.ranks[-1] >= size:
            ps._left_out = (  # type: ignore[attr-defined]
                f"its ranks {ps.ranks} need at least {ps.ranks[-1] + 1} ranks and this round "
                f"has {size}"
            )
            continue
        ps._left_out = None  # type: ignore[attr-defined]
        _register_ranks(ps, initializing=True, set_id=position)


def _register_ranks(ps: ProcessSet, initializing: bool, set_id: Optional[int] = None) -> ProcessSet:
    handle = _native.add_process_set(list(ps.ranks or []), initializing, set_id)
    ps.process_set_id = int(_wait_for_every_rank(handle, f"add_process_set({ps.ranks})"))
    _live_sets[id(ps)] = ps
    return ps


def _wait_for_every_rank(handle: int, call: str) -> Any:
    """Waits for a registration or removal, which completes once every rank made the same
    call; raises :class:`~kolo.exceptions.TimeoutError` after ``KOLO_PROCESS_SET_TIMEOUT``
    seconds (default 300) instead of hanging when some rank never does."""
    seconds = _timeout()
    try:
        return _native.wait(handle, seconds)
    except TimeoutError:
        raise TimeoutError(
            f"{call} waited {seconds:g} s for the other ranks to make the same call: every rank "
            "must add and remove the same process sets in the same order (set "
            "KOLO_PROCESS_SET_TIMEOUT to wait longer). The ranks' process sets may now "
            "differ; call shutdown() and init() again"
        ) from None


def _timeout() -> float:
    return seconds_from_env("KOLO_PROCESS_SET_TIMEOUT", 300.0)


def add_process_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    """Registers a new process set on every rank after ``init`` (needs
    ``KOLO_DYNAMIC_PROCESS_SETS=1``); every rank must call it with the same ranks. Waits at most
    ``KOLO_PROCESS_SET_TIMEOUT`` seconds (default 300) for them, then raises
    :class:`~kolo.exceptions.TimeoutError`.

    Example::

        ps = hvd.add_process_set([0, 1])
    """
    return register(process_set, initializing=False)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered process set on every rank (needs ``KOLO_DYNAMIC_PROCESS_SETS=1``).
    Returns True once removed.

    Example::

        hvd.remove_process_set(ps)
    """
    ps = resolve(process_set)
    if ps.process_set_id == 0:
        raise InvalidArgumentError("the global process set cannot be removed")
    handle = _native.remove_process_set(int(ps.process_set_id))
    _wait_for_every_rank(handle, f"remove_process_set({ps!r})")
    ps.process_set_id = None
    _live_sets.pop(id(ps), None)
    return True
