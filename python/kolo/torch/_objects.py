"""Collectives on Python objects (anything cloudpickle can pickle): Horovod's
``broadcast_object`` and ``allgather_object``, as a length and a byte tensor per object."""

from __future__ import annotations

import io
from typing import Any, Optional

import cloudpickle
import torch

from kolo import _core
from kolo.torch._process_set_args import _process_set_kwargs
from kolo.torch.ops import allgather, broadcast_


def _to_bytes_tensor(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    cloudpickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes_tensor(tensor: torch.Tensor) -> Any:
    return cloudpickle.loads(tensor.numpy().tobytes())


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None
) -> Any:
    """Returns ``root_rank``'s ``obj`` (any cloudpickle-able object) on every rank.

    Example::

        state = hvd.broadcast_object({"epoch": 3} if hvd.rank() == 0 else None, root_rank=0)
    """
    name = _core.op_name("broadcast_object", name)
    ps = _process_set_kwargs(process_set)
    if _core.rank() == root_rank:
        payload = _to_bytes_tensor(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(length, root_rank, name=f"{name}.size", **ps)
        broadcast_(payload, root_rank, name=f"{name}.data", **ps)
        return obj
    length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name=f"{name}.size", **ps)
    payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.data", **ps)
    return _from_bytes_tensor(payload)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order.

    Example::

        hosts = hvd.allgather_object(socket.gethostname())
    """
    name = _core.op_name("allgather_object", name)
    ps = _process_set_kwargs(process_set)
    payload = _to_bytes_tensor(obj)
    lengths = allgather(
        torch.tensor([payload.numel()], dtype=torch.int64), name=f"{name}.sizes", **ps
    )
    gathered = allgather(payload, name=f"{name}.data", **ps)
    objects = []
    offset = 0
    for length in lengths.tolist():
        objects.append(_from_bytes_tensor(gathered[offset : offset + length]))
        offset += length
    return objects
