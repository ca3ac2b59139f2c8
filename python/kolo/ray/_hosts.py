"""Hosts of an elastic Ray job (internal): Horovod's ``RayHostDiscovery`` (the Ray cluster's alive
nodes and their slots), the blacklist with Horovod's cooldown, and the slot plan.

Horovod's pieces, same behaviour: ``horovod/ray/elastic_v2.py`` (``RayHostDiscovery``) and
``horovod/runner/elastic/discovery.py`` (``HostState``, ``HostManager``) and
``horovod/runner/common/util/hosts.py`` (``get_host_assignments``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any, Callable, Dict, Optional, Sequence

from kolo.exceptions import InvalidValueError

logger = logging.getLogger("kolo.ray")

#: Horovod's bounds on ``cooldown_range`` (``DEFAULT_COOLDOWN_LOWER_LIMIT_SECONDS`` and
#: ``DEFAULT_COOLDOWN_UPPER_LIMIT_SECONDS``).
COOLDOWN_LOWER_BOUND_S = 1
COOLDOWN_UPPER_BOUND_S = 60 * 60

#: What changed between two discoveries (Horovod's ``HostUpdateResult`` bit flags).
NO_UPDATE, REMOVED, ADDED = 0, 1, 2


class RayHostDiscovery:
    """Horovod's ``RayHostDiscovery``: every alive Ray node is a host, with
    ``CPU // cpus_per_worker`` slots (and, with ``use_gpu``, at most ``GPU // gpus_per_worker``)
    from the node's total resources; nodes with no slot are left out.

    Hosts are named by Ray node id (Horovod names them by the node's IP, which merges Ray nodes
    that share an address into one host); a discovery of your own (``override_discovery=False``)
    may name hosts by node id or by node IP.

    Example::

        discovery = RayHostDiscovery(cpus_per_worker=2)
        discovery.find_available_hosts_and_slots()   # {"<node id>": 4, ...}
    """

    def __init__(
        self, use_gpu: bool = False, cpus_per_worker: float = 1, gpus_per_worker: float = 1
    ) -> None:
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        """``{node id: slots}`` of the alive nodes with at least one slot.

        Example::

            RayHostDiscovery().find_available_hosts_and_slots()
        """
        import ray

        hosts = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            slots = resources.get("CPU", 0) // self.cpus_per_worker
            if self.use_gpu:
                slots = min(slots, resources.get("GPU", 0) // self.gpus_per_worker)
            slots = math.ceil(slots)
            if slots > 0:
                hosts[node["NodeID"]] = slots
        return hosts


def check_cooldown_range(cooldown_range: Any) -> Optional[tuple[float, float]]:
    """``cooldown_range`` as ``(lower, upper)`` seconds, or None; InvalidValueError otherwise
    (Horovod's bounds: ``1 <= lower <= upper <= 3600``)."""
    if cooldown_range is None:
        return None
    try:
        lower, upper = cooldown_range
        lower, upper = float(lower), float(upper)
    except (TypeError, ValueError):
        raise InvalidValueError(
            f"cooldown_range={cooldown_range!r} must be a pair (lower, upper) of seconds, "
            "e.g. (10, 100)"
        ) from None
    if not (COOLDOWN_LOWER_BOUND_S <= lower <= upper <= COOLDOWN_UPPER_BOUND_S):
        raise InvalidValueError(
            f"cooldown_range={cooldown_range!r} must satisfy {COOLDOWN_LOWER_BOUND_S} <= lower "
            f"<= upper <= {COOLDOWN_UPPER_BOUND_S} seconds"
        )
    return lower, upper


class _HostState:
    """One host's blacklist state (Horovod's ``HostState``): without a cooldown range a
    blacklisted host stays out; with one, it comes back after a cooldown that doubles with
    each blacklisting: ``lower * 2**count + uniform(0, 1) * lower``, clamped to the range."""

    def __init__(self, cooldown: Optional[tuple[float, float]], clock: Callable[[], float]):
        self._cooldown = cooldown
        self._clock = clock
        self.blacklisted = False
        self.count = 0
        self.cooldown_end = 0.0

    def blacklist(self) -> None:
        self.blacklisted = True
        now = self._clock()
        if self.cooldown_end > now or self._cooldown is None:
            return
        lower, upper = self._cooldown
        self.count += 1
        delay = lower * (1 << self.count) + random.uniform(0, 1) * lower
        self.cooldown_end = now + max(lower, min(upper, delay))

    def resurrected(self) -> bool:
        return self.cooldown_end > 0 and self.cooldown_end <= self._clock()

    def whitelist(self) -> None:
        self.blacklisted = False
        self.cooldown_end = 0.0


class HostManager:
    """The hosts a discovery reports, in Horovod's assignment order (hosts keep the order they
    were first seen in; new hosts come last), minus blacklisted ones (``HostManager``)."""

    def __init__(
        self,
        discovery: Any,
        cooldown_range: Optional[tuple[float, float]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._discovery = discovery
        self._cooldown = cooldown_range
        self._clock = clock
        self._states: dict[str, _HostState] = {}
        self._slots: dict[str, int] = {}
        self._order: list[str] = []

    def _state(self, host: str) -> _HostState:
        if host not in self._states:
            self._states[host] = _HostState(self._cooldown, self._clock)
        return self._states[host]

    def update(self) -> int:
        """Asks the discovery again; returns what changed (``NO_UPDATE``, ``REMOVED``, ``ADDED``
        or both), counting a blacklisted host whose cooldown ended as added."""
        found = self._discovery.find_available_hosts_and_slots()
        slots = {str(host): int(count) for host, count in dict(found).items() if int(count) > 0}
        resurrected = [host for host in slots if self._state(host).resurrected()]
        if slots == self._slots and not resurrected:
            return NO_UPDATE
        change = NO_UPDATE
        for host, count in self._slots.items():
            if count > slots.get(host, 0):
                change |= REMOVED
        for host, count in slots.items():
            if count > self._slots.get(host, 0) or host in resurrected:
                change |= ADDED
        for host in resurrected:
            logger.info("RayExecutor: host %s is back after its blacklist cooldown", host)
            self._state(host).whitelist()
        self._order = [host for host in self._order if host in slots] + [
            host for host in slots if host not in self._order
        ]
        self._slots = slots
        return change

    def blacklist(self, host: str) -> None:
        """Moves ``host`` to the blacklist (Horovod: every failure of a worker on it)."""
        if not self._state(host).blacklisted:
            logger.warning("RayExecutor: blacklisting failing host %s", host)
        self._state(host).blacklist()

    def is_blacklisted(self, host: str) -> bool:
        return self._state(host).blacklisted

    def available(self) -> list[tuple[str, int]]:
        """``(host, slots)`` of the usable hosts, in assignment order."""
        return [(host, self._slots[host]) for host in self._order if not self.is_blacklisted(host)]

    def slot_count(self) -> int:
        return sum(count for _, count in self.available())


def plan_slots(hosts: Sequence[tuple[str, int]], max_workers: Optional[int]) -> dict[str, int]:
    """How many workers each host gets: hosts filled in order, up to ``max_workers`` in all
    (Horovod's ``get_host_assignments``)."""
    plan: dict[str, int] = {}
    total = 0
    for host, slots in hosts:
        take = slots if max_workers is None else max(0, min(slots, max_workers - total))
        if take:
            plan[host] = take
            total += take
    return plan
