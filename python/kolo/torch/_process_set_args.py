"""The ``process_set=`` argument of kolo.torch's helpers above the ops (object collectives,
``DistributedOptimizer``, ``SyncBatchNorm``): ``None`` there means every rank."""

from __future__ import annotations

from typing import Any


def _process_set_kwargs(process_set: Any) -> dict[str, Any]:
    """``process_set=`` for an op call, or nothing for the default (every rank)."""
    return {} if process_set is None else {"process_set": process_set}


def _process_set_included(process_set: Any) -> bool:
    """Whether this rank belongs to ``process_set`` (``None`` means every rank)."""
    return process_set is None or bool(process_set.included())
