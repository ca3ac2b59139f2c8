"""Horovod's PyTorch collectives, running on kolo's background engine.

Every op is submitted to the engine and returns a handle at once (``*_async``); the engine
agrees with the other ranks on what is ready, fuses small allreduces and runs them while
Python goes on. ``synchronize(handle)`` waits (without the GIL) and returns the result; the
synchronous ops are submit + synchronize. CPU tensors are used in place where possible; CUDA
tensors of allreduce and broadcast run through NCCL on their device when NCCL is found, the
rest are staged through pinned host memory (see docs/gpu.md). Ops are differentiable where
Horovod's are.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch

from kolo import _core, _native
from kolo._core import ReduceOp, resolve_op
from kolo.exceptions import InvalidArgumentError
from kolo.process_sets import ProcessSet, global_process_set, resolve
from kolo.torch._staging import on_nccl, ready_event, to_pinned_host
from kolo.torch.compression import Compression

_DTYPE_NAMES = {
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bool: "bool",
}


def _dtype_name(tensor: torch.Tensor) -> str:
    try:
        return _DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise InvalidArgumentError(
            f"tensors of dtype {tensor.dtype} are not supported; convert to one of "
            f"{', '.join(str(d) for d in _DTYPE_NAMES)}"
        ) from None


def _staged(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s values (`tensor` itself when it already is one;
    a pinned copy of a CUDA tensor: the host-staged path)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_cuda:
        return to_pinned_host(tensor)
    if tensor.is_contiguous() and tensor.device.type == "cpu":
        return tensor.detach()
    return tensor.detach().cpu().contiguous()


def _device_or_staged(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when the engine runs it through NCCL (see ``on_nccl``), else
    :func:`_staged`."""
    if isinstance(tensor, torch.Tensor) and tensor.is_cuda and on_nccl(tensor):
        return tensor.detach()
    return _staged(tensor)


def _device_or_owned(tensor: torch.Tensor) -> torch.Tensor:
    """A copy on ``tensor``'s device when the engine runs it through NCCL, else
    :func:`_owned_copy`."""
    if isinstance(tensor, torch.Tensor) and tensor.is_cuda and on_nccl(tensor):
        return tensor.detach().clone()
    return _owned_copy(tensor)


def _owned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with `tensor`'s values that shares no memory with it."""
    staged = _staged(tensor)
    return staged.clone() if staged.data_ptr() == tensor.data_ptr() else staged


def _require_dim(tensor: torch.Tensor, what: str) -> None:
    if tensor.dim() == 0:
        raise InvalidArgumentError(
            f"{what} works on the first dimension, but got a 0-dim tensor; use "
            "tensor.reshape(1) (or unsqueeze(0)) first"
        )


def _to_device(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # Asynchronous from pinned memory; from pageable memory the copy has read its source when
    # it returns, so the engine may reuse that buffer.
    if like.device.type == "cpu":
        return result
    return result.to(like.device, non_blocking=True)


def _write_back(target: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
    if staged.data_ptr() != target.data_ptr():
        with torch.no_grad():
            target.copy_(staged, non_blocking=target.device.type == "cuda")
    return target


# --- handles -------------------------------------------------------------------------------


class _Pending:
    """What a handle keeps until it is synchronized: the native handles, the tensors the engine
    works on (kept alive until then), and how to turn the native results into the answer."""

    __slots__ = ("finish", "keep", "natives")

    def __init__(self, natives: list[int], keep: Any, finish: Callable[[list[Any]], Any]) -> None:
        self.natives = natives
        self.keep = keep
        self.finish = finish


#: ``active`` while a synchronous op runs on this thread (see :func:`_waited_at_once`).
_sync_call = threading.local()


def _waited_at_once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a synchronous op: what it submits does not wake the engine thread, because this
    thread waits for it right away and then runs the engine's cycle itself (a thread wake-up it
    does not need costs a context switch: on a rank pinned to one core, half the latency of a
    small allreduce)."""

    @functools.wraps(fn)
    def waited(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_sync_call, "active", False)
        _sync_call.active = True
        try:
            return fn(*args, **kwargs)
        finally:
            _sync_call.active = outer

    return waited


_pending: dict[int, _Pending] = {}
_pending_lock = threading.Lock()
#: The ready events of submitted CUDA ops (native handle → event), until ``_register`` moves
#: them into the handle's kept objects (the engine reads them until the op completed).
_ready_events: dict[int, Any] = {}


def _register(natives: list[int], keep: Any, finish: Callable[[list[Any]], Any]) -> int:
    events = [_ready_events.pop(n) for n in natives if n in _ready_events]
    if events:
        keep = (keep, events)
    handle = natives[0]
    with _pending_lock:
        _pending[handle] = _Pending(natives, keep, finish)
    return handle


def _register_group(parts: list[tuple[int, Any, Any]]) -> int:
    """One handle for several submitted ops (native handle, kept tensor, finisher each)."""
    if not parts:
        raise InvalidArgumentError("grouped ops need at least one tensor")
    finishers = [f for _, _, f in parts]
    return _register(
        [n for n, _, _ in parts],
        [k for _, k, _ in parts],
        lambda results: [f(r) for f, r in zip(finishers, results)],
    )


def _submit(
    kind: str,
    name: str,
    buf: torch.Tensor,
    ps: ProcessSet,
    *,
    op: ReduceOp = _core.Sum,
    prescale: float = 1.0,
    postscale: float = 1.0,
    root: int = 0,
    splits: Sequence[int] = (),
) -> int:
    event = ready_event(buf) if buf.is_cuda else None
    native = _native.submit(
        kind,
        name,
        buf.data_ptr(),
        buf.nbytes,
        list(buf.shape),
        _dtype_name(buf),
        op.name,
        float(prescale),
        float(postscale),
        int(root),
        [int(s) for s in splits] if splits else [],
        int(ps.process_set_id or 0),
        -1 if event is None else int(buf.device.index),
        0 if event is None else int(event.cuda_event),
        not getattr(_sync_call, "active", False),
    )
    if event is not None:
        _ready_events[native] = event
    return native


_NO_SPLITS: list[int] = []


def _plain_cpu(tensor: Any) -> bool:
    """True for a contiguous CPU tensor: the engine reads and writes it where it is."""
    return isinstance(tensor, torch.Tensor) and tensor.is_cpu and tensor.is_contiguous()


def _allreduce_now(
    tensor: torch.Tensor, name: str, op: ReduceOp, prescale: float, postscale: float, ps: ProcessSet
) -> torch.Tensor:
    """Allreduces the contiguous CPU ``tensor`` in place and waits for it: the synchronous ops'
    path, with no handle and no engine wake-up (this thread runs the engine's cycle). Returns
    ``tensor``. Python's share of a small allreduce's latency, so kept to one submit and one
    wait (an allocation per call less also means fewer garbage collections)."""
    native = _native.submit(
        "allreduce",
        name,
        tensor.data_ptr(),
        tensor.nbytes,
        tensor.shape,
        _dtype_name(tensor),
        op.name,
        float(prescale),
        float(postscale),
        0,
        _NO_SPLITS,
        ps.process_set_id or 0,
        -1,
        0,
        False,
    )
    try:
        _native.wait(native)
    except KeyboardInterrupt:
        # The op goes on in the engine, writing into ``tensor``: keep it alive until then.
        _register([native], tensor, _ignore_results)
        raise
    return tensor


def _ignore_results(_: list[Any]) -> None:
    return None


def poll(handle: int) -> bool:
    """True when the op behind ``handle`` has finished (``synchronize`` will not block).

    Example::

        h = hvd.allreduce_async(torch.ones(3))
        while not hvd.poll(h):
            time.sleep(0.001)
        out = hvd.synchronize(h)
    """
    with _pending_lock:
        pending = _pending.get(handle)
    if pending is None:
        raise InvalidArgumentError(f"unknown or already synchronized handle {handle}")
    return all(_native.poll(n) for n in pending.natives)


def synchronize(handle: int) -> Any:
    """Waits for the op behind ``handle`` and returns its result (a tensor; a list for grouped
    ops; ``(output, received_splits)`` for alltoall).

    Example::

        h = hvd.allreduce_async_(grad)
        hvd.synchronize(h)  # grad now holds the average
    """
    with _pending_lock:
        pending = _pending.pop(handle, None)
    if pending is None:
        raise InvalidArgumentError(
            f"unknown or already synchronized handle {handle}; each handle is synchronized once"
        )
    results: list[Any] = []
    try:
        for i, native in enumerate(pending.natives):
            try:
                results.append(_native.wait(native))
            except KeyboardInterrupt:
                # The ops keep running in the engine: keep their tensors alive.
                pending.natives = pending.natives[i:]
                with _pending_lock:
                    _pending[handle] = pending
                raise
    except Exception:
        for native in pending.natives[len(results) + 1 :]:
            try:
                _native.wait(native)
            except Exception:
                pass
        raise
    return pending.finish(results)


def _from_bytes(data: Any, rows: int, like: torch.Tensor) -> torch.Tensor:
    """The engine's output (a DLPack capsule of its bytes, taken over without a copy) as a
    ``(rows, *like.shape[1:])`` tensor of ``like``'s dtype."""
    shape = (rows, *like.shape[1:])
    flat = torch.from_dlpack(data)
    if flat.numel() == 0:
        return torch.empty(shape, dtype=like.dtype)
    return flat.view(like.dtype).reshape(shape)


# --- async ops (Horovod's names) ----------------------------------------------------------------


def _allreduce_submit(
    buf: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    ps: ProcessSet,
) -> int:
    return _submit("allreduce", name, buf, ps, op=op, prescale=prescale, postscale=postscale)


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Starts an in-place allreduce of ``tensor`` (Average by default) and returns a handle;
    ``synchronize(handle)`` returns ``tensor`` holding the result.

    Example::

        h = hvd.allreduce_async_(grad, name="grad.0")
        ...  # overlap other work
        hvd.synchronize(h)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    staged = _device_or_staged(tensor)
    native = _allreduce_submit(
        staged, _core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor, ps
    )
    return _register([native], staged, lambda _: _write_back(tensor, staged))


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Starts an allreduce into a new tensor (the input is not modified); returns a handle.

    Example::

        h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum)
        total = hvd.synchronize(h)
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    out = _device_or_owned(tensor)
    native = _allreduce_submit(
        out, _core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor, ps
    )
    return _register([native], out, lambda _: _to_device(out, tensor))


def _grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool],
    name: Optional[str],
    op: Any,
    prescale_factor: float,
    postscale_factor: float,
    process_set: Any,
    in_place: bool,
) -> int:
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("grouped ops need at least one tensor")
    base = _core.op_name("grouped_allreduce", name)
    bufs = [_device_or_staged(t) if in_place else _device_or_owned(t) for t in tensors]
    natives = [
        _allreduce_submit(b, f"{base}.{i}", reduce_op, prescale_factor, postscale_factor, ps)
        for i, b in enumerate(bufs)
    ]
    if in_place:
        return _register(
            natives, bufs, lambda _: [_write_back(t, b) for t, b in zip(tensors, bufs)]
        )
    return _register(natives, bufs, lambda _: [_to_device(b, t) for t, b in zip(tensors, bufs)])


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Starts allreduces of several tensors, fused by the engine; one handle for the list.

    Example::

        h = hvd.grouped_allreduce_async([w_grad, b_grad])
        w_avg, b_avg = hvd.synchronize(h)
    """
    return _grouped_allreduce(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set, False
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """In-place :func:`grouped_allreduce_async`.

    Example::

        hvd.synchronize(hvd.grouped_allreduce_async_([w_grad, b_grad]))
    """
    return _grouped_allreduce(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set, True
    )


@_waited_at_once
def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """Allreduces several tensors as one fused operation; returns the results in order.

    Example::

        w_avg, b_avg = hvd.grouped_allreduce([w_grad, b_grad])
    """
    compressed = [compression.compress(t) for t in tensors]
    handle = grouped_allreduce_async(
        [c for c, _ in compressed],
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), compressed)]


@_waited_at_once
def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce`.

    Example::

        hvd.grouped_allreduce_([w_grad, b_grad])
    """
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


def _allgather_submit(tensor: torch.Tensor, name: str, ps: ProcessSet) -> tuple[int, Any, Any]:
    _require_dim(tensor, "allgather")
    src = _staged(tensor)
    native = _submit("allgather", name, src, ps)

    def finish(result: Any) -> torch.Tensor:
        data, rows = result
        return _to_device(_from_bytes(data, sum(rows), src), tensor)

    return native, src, finish


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set
) -> int:
    """Starts an allgather (concatenation along the first dimension, in rank order).

    Example::

        h = hvd.allgather_async(torch.ones(hvd.rank() + 1, 2))
        rows = hvd.synchronize(h)
    """
    _core.require_initialized()
    native, keep, finish = _allgather_submit(
        tensor, _core.op_name("allgather", name), resolve(process_set)
    )
    return _register([native], keep, lambda results: finish(results[0]))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts allgathers of several tensors; one handle for the list of results.

    Example::

        a, b = hvd.synchronize(hvd.grouped_allgather_async([x, y]))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    base = _core.op_name("grouped_allgather", name)
    parts = [_allgather_submit(t, f"{base}.{i}", ps) for i, t in enumerate(tensors)]
    return _register_group(parts)


@_waited_at_once
def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """Allgathers several tensors; returns the results in order.

    Example::

        a, b = hvd.grouped_allgather([x, y])
    """
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _broadcast_submit(buf: torch.Tensor, root_rank: int, name: str, ps: ProcessSet) -> int:
    root = int(root_rank)
    if ps.process_set_id != 0:
        if root not in ps.ranks:
            raise InvalidArgumentError(
                f"broadcast '{name}': root rank {root} is not in {ps!r}; root_rank is a global "
                "rank and must be a member of the process set"
            )
        root = ps.ranks.index(root)
    return _submit("broadcast", name, buf, ps, root=root)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts an in-place broadcast from global rank ``root_rank`` (a member of the set).

    Example::

        hvd.synchronize(hvd.broadcast_async_(param.data, root_rank=0))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    staged = _device_or_staged(tensor)
    native = _broadcast_submit(staged, root_rank, _core.op_name("broadcast", name), ps)
    return _register([native], staged, lambda _: _write_back(tensor, staged))


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts a broadcast from ``root_rank`` into a new tensor.

    Example::

        weights = hvd.synchronize(hvd.broadcast_async(weights, root_rank=0))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    out = _device_or_owned(tensor)
    native = _broadcast_submit(out, root_rank, _core.op_name("broadcast", name), ps)
    return _register([native], out, lambda _: _to_device(out, tensor))


def _even_splits(rows: int, world: int) -> list[int]:
    if rows % world != 0:
        raise InvalidArgumentError(
            f"alltoall without splits needs the first dimension ({rows}) to be divisible "
            f"by the number of ranks ({world}); pass splits= to send uneven parts"
        )
    return [rows // world] * world


def _normalize_splits(splits: Any, world: int) -> Optional[list[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()
    values = [int(s) for s in splits]
    if len(values) != world:
        raise InvalidArgumentError(
            f"alltoall splits has {len(values)} entries but the process set has {world} ranks; "
            "give one row count per rank"
        )
    if any(v < 0 for v in values):
        raise InvalidArgumentError(f"alltoall splits must not be negative, got {values}")
    return values


def alltoall_async(
    tensor: torch.Tensor,
    splits: Union[Sequence[int], torch.Tensor, None] = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> int:
    """Starts an alltoall; ``synchronize`` returns ``(output, received_splits)``.

    Example::

        out, received = hvd.synchronize(hvd.alltoall_async(x, splits=[1, 3]))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    _require_dim(tensor, "alltoall")
    world = len(ps.ranks)
    src = _staged(tensor)
    chosen = _normalize_splits(splits, world) or _even_splits(src.shape[0], world)
    native = _submit("alltoall", _core.op_name("alltoall", name), src, ps, splits=chosen)

    def finish(results: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        data, rows = results[0]
        output = _to_device(_from_bytes(data, sum(rows), src), tensor)
        return output, torch.tensor(rows, dtype=torch.int32)

    return _register([native], src, finish)


def _reducescatter_submit(
    tensor: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    ps: ProcessSet,
) -> tuple[int, Any, Any]:
    _require_dim(tensor, "reducescatter")
    src = _staged(tensor)
    native = _submit("reducescatter", name, src, ps, op=op, prescale=prescale, postscale=postscale)
    me = ps.rank()

    def finish(result: Any) -> torch.Tensor:
        data, rows = result
        return _to_device(_from_bytes(data, rows[me], src), tensor)

    return native, src, finish


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Starts a reducescatter (Average by default); ``synchronize`` returns this rank's rows.

    Example::

        part = hvd.synchronize(hvd.reducescatter_async(torch.ones(4, 2), op=hvd.Sum))
    """
    _core.require_initialized()
    native, keep, finish = _reducescatter_submit(
        tensor,
        _core.op_name("reducescatter", name),
        resolve_op(op, None),
        prescale_factor,
        postscale_factor,
        resolve(process_set),
    )
    return _register([native], keep, lambda results: finish(results[0]))


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Starts reducescatters of several tensors; one handle for the list of results.

    Example::

        a, b = hvd.synchronize(hvd.grouped_reducescatter_async([x, y], op=hvd.Sum))
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, None)
    base = _core.op_name("grouped_reducescatter", name)
    parts = [
        _reducescatter_submit(t, f"{base}.{i}", reduce_op, prescale_factor, postscale_factor, ps)
        for i, t in enumerate(tensors)
    ]
    return _register_group(parts)


@_waited_at_once
def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatters several tensors; returns this rank's part of each.

    Example::

        a, b = hvd.grouped_reducescatter([x, y], op=hvd.Sum)
    """
    compressed = [compression.compress(t) for t in tensors]
    handle = grouped_reducescatter_async(
        [c for c, _ in compressed], name, op, process_set, prescale_factor, postscale_factor
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(synchronize(handle), compressed)]


def join(device: int = -1) -> int:
    """Declares that this rank has no more data: until every rank joined, its engine takes part
    in the other ranks' allreduces with zeros (the identity), so ranks with fewer batches do not
    hang the others. Returns the last rank to join. ``device`` is accepted for Horovod
    compatibility.

    Example::

        for batch in my_batches:   # ranks may have different numbers of batches
            train_step(batch)
        hvd.join()
    """
    _core.require_initialized()
    return int(_native.wait(_native.join()))


@_waited_at_once
def barrier(process_set: Any = global_process_set) -> None:
    """Blocks until every rank of the process set has called ``barrier()``.

    Example::

        hvd.barrier()
    """
    _core.require_initialized()
    ps = resolve(process_set)
    _native.wait(
        _submit("barrier", _core.op_name("barrier", None), torch.empty(0, dtype=torch.uint8), ps)
    )


# --- raw synchronous implementations (autograd functions use these) --------------------------


@_waited_at_once
def _allreduce(
    tensor: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    if isinstance(tensor, torch.Tensor) and tensor.is_cpu:
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        return _allreduce_now(out, name, op, prescale, postscale, resolve(process_set))
    return _synchronized(allreduce_async, tensor, None, name, op, prescale, postscale, process_set)


@_waited_at_once
def _synchronized(submit: Callable[..., int], *args: Any) -> Any:
    """``submit(*args)``'s result, waited for at once (the engine is not woken for it)."""
    return synchronize(submit(*args))


@_waited_at_once
def _allgather(
    tensor: torch.Tensor, name: str, process_set: Any = global_process_set
) -> torch.Tensor:
    return synchronize(allgather_async(tensor, name, process_set))


@_waited_at_once
def _alltoall(
    tensor: torch.Tensor,
    splits: Optional[list[int]],
    name: str,
    process_set: Any = global_process_set,
) -> tuple[torch.Tensor, torch.Tensor]:
    return synchronize(alltoall_async(tensor, splits, name, process_set))


@_waited_at_once
def _reducescatter(
    tensor: torch.Tensor,
    name: str,
    op: ReduceOp,
    prescale: float,
    postscale: float,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale, postscale))


# --- autograd functions (Horovod's gradients) -------------------------------------------------


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, ps):  # type: ignore[override]
        ctx.op, ctx.prescale, ctx.postscale, ctx.ps = op, prescale, postscale, ps
        return _allreduce(tensor, name, op, prescale, postscale, ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output,
            _core.op_name("allreduce.grad", None),
            ctx.op,
            ctx.prescale,
            ctx.postscale,
            ctx.ps,
        )
        return grad, None, None, None, None, None


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, ps):  # type: ignore[override]
        _require_dim(tensor, "allgather")
        ctx.rows, ctx.ps = tensor.shape[0], ps
        return _allgather(tensor, name, ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output, _core.op_name("allgather.grad", None), _core.Sum, 1.0, 1.0, ctx.ps
        )
        rows = _allgather(
            torch.tensor([ctx.rows], dtype=torch.int64),
            _core.op_name("allgather.grad", None),
            ctx.ps,
        )
        offset = int(rows[: ctx.ps.rank()].sum().item())
        return grad.narrow(0, offset, ctx.rows), None, None


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    @_waited_at_once
    def forward(ctx, tensor, root_rank, name, ps):  # type: ignore[override]
        ctx.root_rank, ctx.ps = root_rank, ps
        return synchronize(broadcast_async(tensor, root_rank, name, ps))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allreduce(
            grad_output, _core.op_name("broadcast.grad", None), _core.Sum, 1.0, 1.0, ctx.ps
        )
        if _core.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, ps):  # type: ignore[override]
        output, received = _alltoall(tensor, splits, name, ps)
        ctx.received, ctx.ps = received.tolist(), ps
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_received):  # type: ignore[override]
        grad, _ = _alltoall(grad_output, ctx.received, _core.op_name("alltoall.grad", None), ctx.ps)
        return grad, None, None, None


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, ps):  # type: ignore[override]
        ctx.op, ctx.prescale, ctx.postscale, ctx.ps = op, prescale, postscale, ps
        return _reducescatter(tensor, name, op, prescale, postscale, ps)

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _allgather(grad_output, _core.op_name("reducescatter.grad", None), ctx.ps)
        scale = ctx.prescale * ctx.postscale
        if ctx.op == _core.Average:
            scale /= len(ctx.ps.ranks)
        return grad * scale if scale != 1.0 else grad, None, None, None, None, None


# --- public synchronous API -------------------------------------------------------------------


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Reduces ``tensor`` across the ranks (Average by default); the input is not modified.

    Differentiable: the gradient is allreduced the same way.

    Example::

        avg = hvd.allreduce(torch.tensor([float(hvd.rank())]))  # mean of the ranks
        total = hvd.allreduce(torch.ones(3), op=hvd.Sum)         # == hvd.size() * ones
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    args = (_core.op_name("allreduce", name), reduce_op, prescale_factor, postscale_factor, ps)
    if compressed.requires_grad and torch.is_grad_enabled():
        result = _AllreduceFn.apply(compressed, *args)
    else:
        result = _allreduce(compressed, *args)
    return compression.decompress(result, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """In-place :func:`allreduce`: ``tensor`` receives the result and is returned.

    Example::

        grad = torch.ones(4)
        hvd.allreduce_(grad, op=hvd.Sum)  # grad now holds size() in every element
    """
    if _plain_cpu(tensor):
        _core.require_initialized()
        return _allreduce_now(
            tensor,
            _core.op_name("allreduce", name),
            resolve_op(op, average),
            prescale_factor,
            postscale_factor,
            resolve(process_set),
        )
    return _synchronized(
        allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order.

    Ranks may have different first dimensions (even 0); the other dimensions must agree.

    Example::

        rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), hvd.rank()))
    """
    _core.require_initialized()
    return _AllgatherFn.apply(tensor, _core.op_name("allgather", name), resolve(process_set))


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank; the input is not modified.

    Example::

        weights = hvd.broadcast(weights, root_rank=0)
    """
    _core.require_initialized()
    return _BroadcastFn.apply(
        tensor, int(root_rank), _core.op_name("broadcast", name), resolve(process_set)
    )


@_waited_at_once
def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """In-place :func:`broadcast`: every rank's ``tensor`` receives ``root_rank``'s values.

    Example::

        hvd.broadcast_(param.data, root_rank=0)
    """
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall(
    tensor: torch.Tensor,
    splits: Union[Sequence[int], torch.Tensor, None] = None,
    name: Optional[str] = None,
    process_set: Any = global_process_set,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Sends ``splits[j]`` rows of ``tensor`` to rank ``j`` and gathers what every rank sent here.

    Without ``splits`` the first dimension is divided evenly and only the output is returned;
    with ``splits`` the result is ``(output, received_splits)`` as in Horovod.

    Example::

        out, received = hvd.alltoall(torch.arange(4.0), splits=[1, 3])  # on 2 ranks
    """
    _core.require_initialized()
    ps = resolve(process_set)
    _require_dim(tensor, "alltoall")
    normalized = _normalize_splits(splits, len(ps.ranks))
    output, received = _AlltoallFn.apply(tensor, normalized, _core.op_name("alltoall", name), ps)
    return output if splits is None else (output, received)


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Any = None,
    process_set: Any = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduces ``tensor`` across ranks (Average by default) and gives each rank one slice of
    the first dimension: rank ``r`` gets ``rows // size`` rows, plus one if
    ``r < rows % size``.

    Example::

        part = hvd.reducescatter(torch.ones(4, 2), op=hvd.Sum)  # 2 rows each on 2 ranks
    """
    _core.require_initialized()
    ps = resolve(process_set)
    reduce_op = resolve_op(op, None)
    compressed, ctx = compression.compress(tensor)
    result = _ReducescatterFn.apply(
        compressed,
        _core.op_name("reducescatter", name),
        reduce_op,
        prescale_factor,
        postscale_factor,
        ps,
    )
    return compression.decompress(result, ctx)
