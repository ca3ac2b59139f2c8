"""kolo's collectives on numpy arrays: the framework-agnostic layer under ``kolo.keras``.

Every function submits its arrays to kolo's background engine (which fuses and negotiates them
with the other ranks) and waits for all of them, without the GIL. Inputs are never modified:
in-place ops work on a private contiguous copy. Backends reach this layer through
``kolo.keras._bridge`` (eagerly, or from a compiled TensorFlow graph via ``tf.numpy_function``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cloudpickle
import numpy as np

from kolo import _core, _native
from kolo._core import ReduceOp
from kolo.exceptions import InvalidArgumentError
from kolo.process_sets import ProcessSet

_SUPPORTED_DTYPES = (
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "bool",
)


def _dtype_name(array: np.ndarray) -> str:
    name = array.dtype.name
    if name not in _SUPPORTED_DTYPES:
        raise InvalidArgumentError(
            f"arrays of dtype {name} are not supported by kolo's collectives; cast to one of "
            f"{', '.join(_SUPPORTED_DTYPES)}"
        )
    return name


def _private_copy(array: Any) -> np.ndarray:
    """A contiguous, writable array with ``array``'s values that shares no memory with it."""
    return np.array(array, copy=True, order="C")


def _require_dim(array: np.ndarray, kind: str, name: str) -> None:
    if array.ndim == 0:
        raise InvalidArgumentError(
            f"{kind} '{name}' works on the first dimension, but got a 0-dim value; reshape it "
            "to (1,) first"
        )


def _members(ps: ProcessSet) -> list[int]:
    return list(ps.ranks) if ps.ranks is not None else list(range(_core.size()))


def _submit(
    kind: str,
    name: str,
    buf: np.ndarray,
    ps: ProcessSet,
    *,
    op: ReduceOp = _core.Sum,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = 0,
) -> int:
    if op is _core.Adasum:
        _core.check_adasum(ps.size() or _core.size())
    return _native.submit(
        kind,
        name,
        int(buf.ctypes.data),
        int(buf.nbytes),
        [int(d) for d in buf.shape],
        _dtype_name(buf),
        op.name,
        float(prescale),
        float(postscale),
        int(root),
        [],
        int(ps.process_set_id or 0),
        keep=buf,
    )


def _wait_all(natives: list[int]) -> list[Any]:
    """Waits for every handle (even after one failed, so no buffer is freed while in use)."""
    results: list[Any] = []
    error: BaseException | None = None
    for native in natives:
        try:
            results.append(_native.wait(native))
        except BaseException as exc:  # re-raised below, after the others finish
            results.append(None)
            error = error or exc
    if error is not None:
        raise error
    return results


class _Capsule:
    """Hands a DLPack capsule from the engine to ``numpy.from_dlpack`` (which takes an object
    with ``__dlpack__``, not a bare capsule)."""

    __slots__ = ("capsule",)

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def _from_engine(data: Any, rows: int, like: np.ndarray) -> np.ndarray:
    """The engine's output bytes as a ``(rows, *like.shape[1:])`` array of ``like``'s dtype."""
    shape = (rows, *like.shape[1:])
    flat = np.from_dlpack(_Capsule(data))
    if flat.size == 0:
        return np.empty(shape, dtype=like.dtype)
    return flat.view(like.dtype).reshape(shape)


def allreduce(
    arrays: Sequence[Any],
    names: Sequence[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    ps: ProcessSet,
) -> list[np.ndarray]:
    """Reduces each array over the ranks of ``ps`` (one op per array, fused by the engine).

    Example::

        total, = _arrays.allreduce([np.ones(3)], ["x"], hvd.Sum, 1.0, 1.0, global_process_set)
    """
    _core.require_initialized()
    bufs = [_private_copy(a) for a in arrays]
    with _core.submitted_together():
        natives = [
            _submit("allreduce", name, b, ps, op=op, prescale=prescale, postscale=postscale)
            for name, b in zip(names, bufs)
        ]
    _wait_all(natives)
    return bufs


def allgather(arrays: Sequence[Any], names: Sequence[str], ps: ProcessSet) -> list[np.ndarray]:
    """Concatenates each array along its first dimension over the ranks of ``ps`` (rank order).

    Example::

        rows, = _arrays.allgather([np.ones((2, 3))], ["x"], global_process_set)
    """
    _core.require_initialized()
    bufs = [_private_copy(a) for a in arrays]
    for name, b in zip(names, bufs):
        if b.ndim == 0:
            raise InvalidArgumentError(
                f"allgather '{name}' works on the first dimension, but got a 0-dim value; "
                "reshape it to (1,) first"
            )
    with _core.submitted_together():
        natives = [_submit("allgather", name, b, ps) for name, b in zip(names, bufs)]
    results = _wait_all(natives)
    return [_from_engine(data, sum(rows), b) for (data, rows), b in zip(results, bufs)]


def reducescatter(
    arrays: Sequence[Any],
    names: Sequence[str],
    op: ReduceOp,
    prescale: float,
    postscale: float,
    ps: ProcessSet,
) -> list[np.ndarray]:
    """Reduces each array over the ranks of ``ps`` and returns this rank's part of the first
    dimension (the first ``rows % size`` ranks get one row more), one op per array.

    Example::

        part, = _arrays.reducescatter([np.ones((4, 2))], ["x"], hvd.Sum, 1.0, 1.0, ps)
    """
    _core.require_initialized()
    bufs = [_private_copy(a) for a in arrays]
    natives = []
    with _core.submitted_together():
        for name, buf in zip(names, bufs):
            _require_dim(buf, "reducescatter", name)
            natives.append(
                _submit(
                    "reducescatter", name, buf, ps, op=op, prescale=prescale, postscale=postscale
                )
            )
    results = _wait_all(natives)
    me = _members(ps).index(_core.rank())
    return [_from_engine(data, rows[me], buf) for (data, rows), buf in zip(results, bufs)]


def broadcast(
    arrays: Sequence[Any], root_rank: int, names: Sequence[str], ps: ProcessSet
) -> list[np.ndarray]:
    """Returns ``root_rank``'s arrays on every rank of ``ps`` (``root_rank`` is a global rank).

    Example::

        weights = _arrays.broadcast(weights, 0, names, global_process_set)
    """
    _core.require_initialized()
    root = int(root_rank)
    if ps.process_set_id != 0:
        if root not in ps.ranks:
            raise InvalidArgumentError(
                f"broadcast: root rank {root} is not in {ps!r}; root_rank is a global rank and "
                "must be a member of the process set"
            )
        root = ps.ranks.index(root)
    elif not 0 <= root < _core.size():
        raise InvalidArgumentError(
            f"broadcast: root_rank {root} is out of range for a job of {_core.size()} ranks"
        )
    bufs = [_private_copy(a) for a in arrays]
    with _core.submitted_together():
        natives = [_submit("broadcast", name, b, ps, root=root) for name, b in zip(names, bufs)]
    _wait_all(natives)
    return bufs


def barrier(ps: ProcessSet) -> None:
    """Blocks until every rank of ``ps`` has called it.

    Example::

        _arrays.barrier(global_process_set)
    """
    _core.require_initialized()
    empty = np.empty(0, dtype=np.uint8)
    _wait_all([_submit("barrier", _core.op_name("barrier", None), empty, ps)])


def broadcast_object(obj: Any, root_rank: int, name: str, ps: ProcessSet) -> Any:
    """Returns ``root_rank``'s ``obj`` (anything cloudpickle can pickle) on every rank.

    Example::

        config = _arrays.broadcast_object(config, 0, "config", global_process_set)
    """
    is_root = _core.rank() == int(root_rank)
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8) if is_root else None
    length = np.array([payload.size if payload is not None else 0], dtype=np.int64)
    (length,) = broadcast([length], root_rank, [f"{name}.size"], ps)
    if payload is None:
        payload = np.zeros(int(length[0]), dtype=np.uint8)
    (payload,) = broadcast([payload], root_rank, [f"{name}.data"], ps)
    return obj if is_root else cloudpickle.loads(payload.tobytes())


def allgather_object(obj: Any, name: str, ps: ProcessSet) -> list[Any]:
    """Returns every rank's ``obj`` in rank order.

    Example::

        hosts = _arrays.allgather_object(socket.gethostname(), "hosts", global_process_set)
    """
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    (lengths,) = allgather([np.array([payload.size], dtype=np.int64)], [f"{name}.sizes"], ps)
    (data,) = allgather([payload], [f"{name}.data"], ps)
    objects, offset = [], 0
    for length in lengths.tolist():
        objects.append(cloudpickle.loads(data[offset : offset + length].tobytes()))
        offset += length
    return objects
