"""NCCL collectives on CUDA tensors, called directly: one communicator per process set on this
rank's device (:class:`NcclGroup`), and what kolo found of CUDA and NCCL (:func:`probe`).

This is the device half of kolo's GPU support (see docs/gpu.md): it runs NCCL on kolo's own
CUDA stream with the stream discipline of Horovod — each op first waits (through a CUDA
event, not a host sync) for the work already queued on torch's current stream, and torch's
current stream then waits for the result — and fuses same-dtype allreduces into one device
buffer packed by one kernel launch (prescale/postscale applied on the way). The ops here are
called in the same order on every rank of the set (like torch.distributed), without the
engine's negotiation; ``hvd.allreduce`` and ``hvd.broadcast`` on CUDA tensors reach the same
device code through the engine (see docs/gpu.md).

Example::

    import torch, kolo.torch as hvd
    from kolo.torch.nccl import NcclGroup

    hvd.init()
    torch.cuda.set_device(hvd.local_rank())
    group = NcclGroup()
    grads = [torch.ones(10, device="cuda"), torch.ones(3, device="cuda")]
    group.allreduce_(grads)  # averaged over every rank
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch

from kolo import _core, _native
from kolo._core import ReduceOp, resolve_op
from kolo.exceptions import ConfigError, InvalidArgumentError
from kolo.process_sets import ProcessSet, global_process_set, resolve
from kolo.torch._buffers import _dtype_name as _dtype
from kolo.torch._objects import allgather_object, broadcast_object

__all__ = ["DEFAULT_TIMEOUT", "NcclGroup", "probe", "require_nccl"]

#: Seconds :meth:`NcclGroup.synchronize` waits for the GPU before raising TimeoutError.
DEFAULT_TIMEOUT = 300.0


def probe() -> dict[str, Any]:
    """What kolo found at run time: ``cuda``, ``nccl`` and ``pack_kernel`` (booleans), the
    library paths and versions, and ``*_error`` explaining what is missing.

    Example::

        from kolo.torch.nccl import probe
        print(probe()["nccl"], probe().get("nccl_error"))
    """
    return dict(_native.cuda_probe())


def require_nccl() -> dict[str, Any]:
    """The probe, or ConfigError saying why NCCL collectives cannot run here.

    Example::

        require_nccl()  # raises ConfigError on a machine without an NVIDIA driver
    """
    found = probe()
    if not found["built"]:
        raise ConfigError(
            "this kolo was built without CUDA support (the `cuda` feature); install a kolo "
            "wheel built with it"
        )
    if not found["cuda"]:
        raise ConfigError(
            f"CUDA tensors cannot use NCCL here: {found.get('cuda_error', 'no CUDA device')}. "
            "Run on a machine with an NVIDIA GPU and driver, or keep tensors on the CPU"
        )
    if not found["nccl"]:
        raise ConfigError(
            f"NCCL is not available: {found.get('nccl_error')}. Install torch's CUDA wheels "
            "(they bring nvidia-nccl-cu12/cu13) or set KOLO_NCCL_LIBRARY to libnccl.so.2"
        )
    return found


class NcclGroup:
    """NCCL collectives among the ranks of ``process_set`` on ``device`` (default: the current
    CUDA device). Every member must create it, in the same order relative to other
    collectives; rank 0 of the set makes the NCCL unique id and kolo broadcasts it.

    Example::

        group = NcclGroup(device=torch.device("cuda", hvd.local_rank()))
        group.broadcast_(params, root_rank=0)
    """

    def __init__(
        self, process_set: Any = global_process_set, device: Optional[torch.device] = None
    ) -> None:
        _core.require_initialized()
        require_nccl()
        ps = resolve(process_set)
        self.process_set: ProcessSet = ps
        if ps is global_process_set:
            self.rank, self.size = _core.rank(), _core.size()
            root = 0
        else:
            self.rank, self.size = int(ps.rank() or 0), int(ps.size() or 0)
            if self.rank < 0:
                raise InvalidArgumentError(f"rank {_core.rank()} is not a member of {ps!r}")
            root = ps.ranks[0]
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device)
        if device.type != "cuda" or device.index is None:
            raise InvalidArgumentError(f"NcclGroup needs a CUDA device with an index, got {device}")
        self.device = device
        # torch must own the device's primary context before kolo retains it (same context).
        torch.cuda.init()
        torch.empty(1, device=device)
        self._gpu = _native.Gpu(device.index)
        self._kolo_stream = torch.cuda.ExternalStream(self._gpu.stream(), device=device)
        uid = _native.nccl_unique_id() if _core.rank() == root else None
        uid = broadcast_object(uid, root_rank=root, process_set=self._ps_arg())
        with torch.cuda.device(device):
            self._gpu.connect(bytes(uid), self.rank, self.size)

    # --- helpers -------------------------------------------------------------------------

    def _check(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != self.device:
            raise InvalidArgumentError(
                f"this NcclGroup runs on {self.device}, but a tensor is on {tensor.device}; "
                "move it there first"
            )
        if not tensor.is_contiguous():
            raise InvalidArgumentError(
                "NCCL collectives need contiguous tensors; call .contiguous()"
            )

    def _stream(self) -> int:
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def _keep(self, tensors: Sequence[torch.Tensor], event: Any) -> Any:
        # The caching allocator must not hand the memory to torch's stream work before kolo's
        # stream is done with it.
        for t in tensors:
            t.record_stream(self._kolo_stream)
        return event

    # --- collectives ---------------------------------------------------------------------

    def allreduce_(
        self,
        tensors: Sequence[torch.Tensor] | torch.Tensor,
        op: Any = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> Any:
        """Allreduces ``tensors`` (one dtype) in place as one fused NCCL call (Average by
        default); returns them. Torch's current stream waits for the result.

        Example::

            group.allreduce_([g1, g2], op=hvd.Sum)
        """
        single = isinstance(tensors, torch.Tensor)
        items = [tensors] if single else list(tensors)
        if not items:
            return tensors
        dtype = _dtype(items[0])
        for t in items:
            self._check(t)
            if _dtype(t) != dtype:
                raise InvalidArgumentError(
                    f"a fused allreduce needs one dtype; got {items[0].dtype} and {t.dtype}"
                )
        reduce_op: ReduceOp = resolve_op(op, None)
        event = self._gpu.allreduce(
            [t.data_ptr() for t in items],
            [t.nbytes for t in items],
            dtype,
            reduce_op.name,
            float(prescale_factor),
            float(postscale_factor),
            self._stream(),
        )
        self._last = self._keep(items, event)
        return tensors

    def broadcast_(self, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
        """Overwrites ``tensor`` with rank ``root_rank``'s (a rank of the set).

        Example::

            group.broadcast_(weights, root_rank=0)
        """
        self._check(tensor)
        if not 0 <= int(root_rank) < self.size:
            raise InvalidArgumentError(
                f"root_rank {root_rank} is out of range for {self.size} ranks"
            )
        event = self._gpu.broadcast(
            tensor.data_ptr(), tensor.nbytes, _dtype(tensor), int(root_rank), self._stream()
        )
        self._last = self._keep([tensor], event)
        return tensor

    def allgather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenates every rank's ``tensor`` along the first dimension (first dimensions may
        differ; the rest must match).

        Example::

            rows = group.allgather(torch.ones(hvd.rank() + 1, 4, device="cuda"))
        """
        self._check(tensor)
        if tensor.dim() == 0:
            raise InvalidArgumentError("allgather needs at least one dimension; reshape(1) first")
        rows = [int(r) for r in allgather_object(int(tensor.shape[0]), process_set=self._ps_arg())]
        row = int(torch.Size(tensor.shape[1:]).numel())
        out = torch.empty((sum(rows), *tensor.shape[1:]), dtype=tensor.dtype, device=self.device)
        event = self._gpu.allgather(
            tensor.data_ptr(),
            tensor.nbytes,
            [r * row for r in rows],
            out.data_ptr(),
            out.nbytes,
            _dtype(tensor),
            self._stream(),
        )
        self._last = self._keep([tensor, out], event)
        return out

    def reducescatter(
        self,
        tensor: torch.Tensor,
        op: Any = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
    ) -> torch.Tensor:
        """Reduces ``tensor`` over the ranks and returns this rank's block of rows (Horovod's
        split: the first ``rows % size`` ranks get one extra row). ``tensor`` is unchanged.

        Example::

            part = group.reducescatter(torch.ones(8, 2, device="cuda"), op=hvd.Sum)
        """
        self._check(tensor)
        if tensor.dim() == 0:
            raise InvalidArgumentError("reducescatter needs at least one dimension")
        n = int(tensor.shape[0])
        rows = [n // self.size + (1 if r < n % self.size else 0) for r in range(self.size)]
        row = int(torch.Size(tensor.shape[1:]).numel())
        out = torch.empty(
            (rows[self.rank], *tensor.shape[1:]), dtype=tensor.dtype, device=self.device
        )
        reduce_op: ReduceOp = resolve_op(op, None)
        event = self._gpu.reducescatter(
            tensor.data_ptr(),
            tensor.nbytes,
            [r * row for r in rows],
            out.data_ptr(),
            out.nbytes,
            _dtype(tensor),
            reduce_op.name,
            float(prescale_factor),
            float(postscale_factor),
            self._stream(),
        )
        self._last = self._keep([tensor, out], event)
        return out

    def alltoall(
        self, tensor: torch.Tensor, splits: Optional[Sequence[int]] = None
    ) -> tuple[torch.Tensor, list[int]]:
        """Sends ``splits[r]`` rows to rank ``r`` (even split by default); returns the rows
        received (in rank order) and how many came from each rank.

        Example::

            received, counts = group.alltoall(x, splits=[1, 3])
        """
        self._check(tensor)
        if tensor.dim() == 0:
            raise InvalidArgumentError("alltoall needs at least one dimension")
        n = int(tensor.shape[0])
        if splits is None:
            if n % self.size:
                raise InvalidArgumentError(
                    f"{n} rows do not split evenly over {self.size} ranks; pass splits="
                )
            splits = [n // self.size] * self.size
        splits = [int(s) for s in splits]
        if len(splits) != self.size or sum(splits) != n or min(splits) < 0:
            raise InvalidArgumentError(
                f"splits {splits} must have {self.size} non-negative entries summing to {n}"
            )
        matrix = allgather_object(splits, process_set=self._ps_arg())
        received = [int(matrix[r][self.rank]) for r in range(self.size)]
        row = int(torch.Size(tensor.shape[1:]).numel())
        out = torch.empty(
            (sum(received), *tensor.shape[1:]), dtype=tensor.dtype, device=self.device
        )
        event = self._gpu.alltoall(
            tensor.data_ptr(),
            tensor.nbytes,
            [s * row for s in splits],
            out.data_ptr(),
            out.nbytes,
            [r * row for r in received],
            _dtype(tensor),
            self._stream(),
        )
        self._last = self._keep([tensor, out], event)
        return out, received

    def batched_copy(
        self,
        sources: Sequence[torch.Tensor],
        destinations: Sequence[torch.Tensor],
        factor: float = 1.0,
    ) -> None:
        """Copies ``sources[i]`` into ``destinations[i]`` (same sizes, one dtype) with one
        launch of kolo's pack kernel, scaling by ``factor``: the fusion buffer's packing step.

        Example::

            group.batched_copy(grads, views_into_a_flat_buffer, factor=1 / hvd.size())
        """
        if len(sources) != len(destinations):
            raise InvalidArgumentError("batched_copy needs as many sources as destinations")
        for s, d in zip(sources, destinations):
            self._check(s)
            self._check(d)
            if s.nbytes != d.nbytes or s.dtype != d.dtype:
                raise InvalidArgumentError("batched_copy pairs need equal sizes and dtypes")
        if not sources:
            return
        event = self._gpu.batched_copy(
            [s.data_ptr() for s in sources],
            [d.data_ptr() for d in destinations],
            [s.nbytes for s in sources],
            _dtype(sources[0]),
            float(factor),
            self._stream(),
        )
        self._last = self._keep([*sources, *destinations], event)

    def synchronize(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Blocks the host until the last op's result is ready (TimeoutError after
        ``timeout`` seconds). Torch's stream already waits by itself; this is for host code.

        Example::

            group.allreduce_(grads); group.synchronize()
        """
        last = getattr(self, "_last", None)
        if last is not None:
            last.wait(float(timeout))

    def _ps_arg(self) -> Optional[ProcessSet]:
        return None if self.process_set is global_process_set else self.process_set
