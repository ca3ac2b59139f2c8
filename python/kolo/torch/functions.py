"""Object-level collectives (Horovod's ``broadcast_object`` and ``allgather_object``)."""

from __future__ import annotations

import io
from typing import Any, Optional

import cloudpickle
import torch

from kolo import _core
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
    if _core.rank() == root_rank:
        payload = _to_bytes_tensor(obj)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(length, root_rank, name=f"{name}.size", process_set=process_set)
        broadcast_(payload, root_rank, name=f"{name}.data", process_set=process_set)
        return obj
    length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name=f"{name}.size", process_set=process_set)
    payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.data", process_set=process_set)
    return _from_bytes_tensor(payload)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order.

    Example::

        hosts = hvd.allgather_object(socket.gethostname())
    """
    name = _core.op_name("allgather_object", name)
    payload = _to_bytes_tensor(obj)
    lengths = allgather(
        torch.tensor([payload.numel()], dtype=torch.int64),
        name=f"{name}.sizes",
        process_set=process_set,
    )
    gathered = allgather(payload, name=f"{name}.data", process_set=process_set)
    objects = []
    offset = 0
    for length in lengths.tolist():
        objects.append(_from_bytes_tensor(gathered[offset : offset + length]))
        offset += length
    return objects
