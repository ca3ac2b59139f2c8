"""The collectives ``kolo.keras._arrays`` lacks, on numpy arrays: alltoall (reducescatter,
shared with ``kolo.keras``, lives in ``kolo.keras._arrays`` and is re-exported here).

Like ``kolo.keras._arrays``, every function submits all its arrays to kolo's engine before it
waits for any (so the engine can fuse them) and never modifies its inputs.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from kolo import _core, _native
from kolo.exceptions import InvalidArgumentError
from kolo.keras._arrays import (
    _dtype_name,
    _from_engine,
    _members,
    _private_copy,
    _require_dim,
    _wait_all,
    reducescatter,
)

__all__ = ["alltoall", "alltoall_splits", "join", "reducescatter"]
from kolo.process_sets import ProcessSet


def alltoall_splits(splits: Optional[np.ndarray], rows: int, world: int, name: str) -> list[int]:
    """The rows to send to each rank: ``splits`` checked, or ``rows`` cut evenly."""
    if splits is None or splits.size == 0:  # Horovod passes an empty tensor for "none"
        if rows % world != 0:
            raise InvalidArgumentError(
                f"alltoall '{name}' without splits needs the first dimension ({rows}) to be "
                f"divisible by the number of ranks ({world}); pass splits= to send uneven parts"
            )
        return [rows // world] * world
    if not np.issubdtype(splits.dtype, np.integer):
        raise InvalidArgumentError(
            f"alltoall '{name}': splits must be integers (tf.int32), got {splits.dtype}"
        )
    values = [int(s) for s in splits.reshape(-1)]
    if len(values) != world:
        raise InvalidArgumentError(
            f"alltoall '{name}': splits has {len(values)} entries but the process set has "
            f"{world} ranks; give one row count per rank"
        )
    if any(v < 0 for v in values):
        raise InvalidArgumentError(f"alltoall '{name}': splits must not be negative, got {values}")
    if sum(values) != rows:
        raise InvalidArgumentError(
            f"alltoall '{name}': splits sum to {sum(values)} but the tensor has {rows} rows"
        )
    return values


def alltoall(
    array: Any, splits: Optional[np.ndarray], name: str, ps: ProcessSet
) -> tuple[np.ndarray, np.ndarray]:
    """Sends ``splits[i]`` consecutive rows of ``array`` to the i-th rank of ``ps`` and returns
    the rows received (in rank order) with the int32 row count received from each rank.

    Example::

        out, received = _array_ops.alltoall(np.arange(4.0), None, "x", global_process_set)
    """
    _core.require_initialized()
    buf = _private_copy(array)
    _require_dim(buf, "alltoall", name)
    chosen = alltoall_splits(splits, buf.shape[0], len(_members(ps)), name)
    native = _native.submit(
        "alltoall",
        name,
        int(buf.ctypes.data),
        int(buf.nbytes),
        [int(d) for d in buf.shape],
        _dtype_name(buf),
        _core.Sum.name,
        1.0,
        1.0,
        0,
        chosen,
        int(ps.process_set_id or 0),
        keep=buf,
    )
    ((data, rows),) = _wait_all([native])
    return _from_engine(data, sum(rows), buf), np.asarray(rows, dtype=np.int32)


def join() -> int:
    """Joins (see ``kolo.torch.join``) and returns the last rank to join.

    Example::

        last = _array_ops.join()
    """
    _core.require_initialized()
    return int(_native.wait(_native.join()))
