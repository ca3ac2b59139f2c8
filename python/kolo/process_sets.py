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
from typing import Any, Optional, Union

from kolo import _core, _native
from kolo.exceptions import InvalidArgumentError

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


class ProcessSet:
    """A set of global ranks that runs collectives among themselves.

    Example::

        ps = hvd.ProcessSet([0, 1])
    """

    def __init__(self, ranks: Iterable[int]) -> None:
        self.ranks: list[int] = sorted(int(r) for r in ranks)
        self.process_set_id: Optional[int] = None

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
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> Optional[bool]:
        """Whether this process is a member, or None before the set is registered."""
        if not self._registered():
            return None
        return _core.rank() in self.ranks

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


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
        raise InvalidArgumentError(
            f"{process_set!r} is not registered; pass it to init(process_sets=[...]) or to "
            "add_process_set() first"
        )
    return process_set


def _as_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    return process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)


def register(process_set: Union[ProcessSet, Iterable[int]], initializing: bool) -> ProcessSet:
    """Registers a set on every rank (all ranks must call this alike, in the same order)."""
    ps = _as_set(process_set)
    if ps.process_set_id is not None:
        raise InvalidArgumentError(f"{ps!r} is already registered")
    handle = _native.add_process_set(ps.ranks, initializing)
    ps.process_set_id = int(_native.wait(handle))
    _live_sets[id(ps)] = ps
    return ps


def add_process_set(process_set: Union[ProcessSet, Iterable[int]]) -> ProcessSet:
    """Registers a new process set on every rank after ``init`` (needs
    ``KOLO_DYNAMIC_PROCESS_SETS=1``); every rank must call it with the same ranks.

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
    _native.wait(_native.remove_process_set(int(ps.process_set_id)))
    ps.process_set_id = None
    _live_sets.pop(id(ps), None)
    return True
