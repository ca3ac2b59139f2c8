"""Handles of submitted ops: ``_submit`` hands a tensor to the engine, ``_register`` keeps what
a handle needs (the native handles, the tensors the engine works on, how to finish the result)
until :func:`synchronize` waits for it (without the GIL); :func:`poll` asks whether it is done.
Synchronous ops are marked :func:`_waited_at_once`: what they submit does not wake the engine
thread, since they wait for it at once."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kolo import _core, _native
from kolo._core import Adasum, ReduceOp, check_adasum
from kolo.exceptions import InvalidArgumentError
from kolo.process_sets import ProcessSet
from kolo.torch._buffers import _dtype_name
from kolo.torch._staging import ready_event


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


def _register(natives: list[int], keep: Any, finish: Callable[[list[Any]], Any]) -> int:
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
    if op is Adasum:
        check_adasum(ps.size() or _core.size())
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
        # The native handle holds the tensor (and the CUDA ready event the engine reads) from
        # the submission on, until its result is waited for: a KeyboardInterrupt before the
        # caller registers the handle cannot free memory the engine still uses.
        buf if event is None else (buf, event),
    )
    return native


_NO_SPLITS: list[int] = []


def _allreduce_now(
    tensor: torch.Tensor, name: str, op: ReduceOp, prescale: float, postscale: float, ps: ProcessSet
) -> torch.Tensor:
    """Allreduces the contiguous CPU ``tensor`` in place and waits for it: the synchronous ops'
    path, with no handle and no engine wake-up (this thread runs the engine's cycle). Returns
    ``tensor``. Python's share of a small allreduce's latency, so kept to one submit and one
    wait (an allocation per call less also means fewer garbage collections)."""
    if op is Adasum:
        check_adasum(ps.size() or _core.size())
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
        tensor,
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


def synchronize(handle: Any) -> Any:
    """Waits for the op behind ``handle`` and returns its result (a tensor; a list for grouped
    ops; ``(output, received_splits)`` for alltoall). The handle of
    :func:`~kolo.torch.sparse_allreduce_async` is a function: it is called.

    Example::

        h = hvd.allreduce_async_(grad)
        hvd.synchronize(h)  # grad now holds the average
    """
    if callable(handle):
        return handle()
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


@_waited_at_once
def _synchronized(submit: Callable[..., int], *args: Any) -> Any:
    """``submit(*args)``'s result, waited for at once (the engine is not woken for it)."""
    return synchronize(submit(*args))
