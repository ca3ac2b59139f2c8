"""kolo's collectives in the shapes Lightning's strategies expect (shared by
:class:`~kolo.lightning.KoloStrategy` for the Trainer and
:class:`~kolo.lightning.KoloFabricStrategy` for Fabric): ``reduce``, ``all_gather``,
``broadcast``, ``barrier``, and the device a rank drives.

Example::

    from kolo.lightning import _collectives as collectives

    mean = collectives.reduce(torch.tensor(1.0), None, "mean", "my reduce")
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from lightning.fabric.utilities.types import ReduceOp
from torch import Tensor

from kolo._rank_gpu import rank_gpu_index
from kolo.exceptions import InvalidArgumentError
from kolo.lightning.environment import _hvd

__all__ = ["all_gather", "barrier", "broadcast", "reduce", "root_device"]

_MEAN = ("mean", "avg", "average")


def _op_name(reduce_op: Any) -> str:
    """``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or ``"product"`` for Lightning's
    ``reduce_op`` (a string, ``None`` for mean, or a ``torch.distributed.ReduceOp``)."""
    if reduce_op is None:
        return "mean"
    if isinstance(reduce_op, str):
        name = reduce_op.lower()
        if name in _MEAN:
            return "mean"
        if name in ("sum", "max", "min", "product"):
            return name
    else:
        for name in ("SUM", "MAX", "MIN", "PRODUCT", "AVG"):
            op = getattr(ReduceOp, name, None)
            if op is not None and reduce_op == op:
                return "mean" if name == "AVG" else name.lower()
    raise InvalidArgumentError(
        f"reduce_op={reduce_op!r} is not supported by KoloStrategy.reduce: use 'mean', 'sum', "
        "'max', 'min' or 'product' (or the torch.distributed.ReduceOp of one of them)"
    )


def root_device(parallel_devices: Optional[List[torch.device]], local_rank: int) -> torch.device:
    """The device of a rank: the CPU (or whatever non-CUDA device Lightning chose), or
    ``cuda:<i>`` with ``i`` the GPU its launcher assigned (the Spark task's under
    ``kolo.spark.run``), else ``local_rank`` (modulo the visible GPUs).

    Example::

        root_device([torch.device("cpu")], 1)      # device(type='cpu')
    """
    devices = parallel_devices or [torch.device("cpu")]
    if devices[0].type != "cuda":
        return devices[0]
    count = max(1, torch.cuda.device_count())
    return torch.device("cuda", rank_gpu_index(local_rank) % count)


def barrier() -> None:
    """``hvd.barrier()`` when there are several ranks.

    Example::

        barrier()
    """
    hvd = _hvd()
    if hvd.size() > 1:
        hvd.barrier()


def broadcast(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (anything picklable) on every rank.

    Example::

        path = broadcast(tempfile.mkdtemp() if hvd.rank() == 0 else None)
    """
    hvd = _hvd()
    if hvd.size() == 1:
        return obj
    return hvd.broadcast_object(obj, root_rank=src)


def _on_host(tensor: Tensor, collective: Any) -> Tensor:
    """``collective(tensor)``, through host memory for CUDA tensors when this kolo build has
    no NCCL."""
    if tensor.is_cuda and not _hvd().nccl_built():
        return collective(tensor.cpu()).to(tensor.device)
    return collective(tensor.contiguous())


def reduce(tensor: Any, group: Optional[Any], reduce_op: Any, what: str) -> Any:
    """``tensor`` reduced over every rank (``"mean"``/``None``, ``"sum"``, ``"max"``,
    ``"min"``, ``"product"`` or a ``torch.distributed.ReduceOp``); a mean of integers is a
    float. Non-tensors are returned as they are; ``what`` names the caller in errors.

    Example::

        total = reduce(torch.tensor(2), None, "sum", "KoloStrategy.reduce")
    """
    if group is not None:
        raise InvalidArgumentError(
            f"{what} reduces over every rank: leave group=None (use kolo.torch.allreduce with a "
            "process_set for a subset)"
        )
    if not isinstance(tensor, Tensor):
        return tensor
    name = _op_name(reduce_op)
    hvd = _hvd()
    if hvd.size() == 1:
        return tensor
    ops = {"sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min, "product": hvd.Product}
    if name == "mean":
        if tensor.is_floating_point() or tensor.is_complex():
            return _on_host(tensor, lambda t: hvd.allreduce(t, op=hvd.Average))
        summed = _on_host(tensor, lambda t: hvd.allreduce(t, op=hvd.Sum))
        return summed / hvd.size()
    return _on_host(tensor, lambda t: hvd.allreduce(t, op=ops[name]))


def all_gather(tensor: Tensor, group: Optional[Any], sync_grads: bool) -> Tensor:
    """Every rank's ``tensor`` stacked along a new first dimension (``[size, *shape]``);
    gradients flow back through it with ``sync_grads=True``.

    Example::

        everyone = all_gather(torch.tensor([hvd.rank()]), None, False)   # [[0], [1]]
    """
    if group is not None:
        raise InvalidArgumentError("all_gather gathers from every rank: leave group=None")
    if not sync_grads:
        tensor = tensor.detach()
    hvd = _hvd()
    if hvd.size() == 1:
        return tensor.unsqueeze(0)
    return _on_host(tensor.unsqueeze(0), hvd.allgather)


class KoloRanks:
    """What :class:`~kolo.lightning.KoloStrategy` and
    :class:`~kolo.lightning.fabric.KoloFabricStrategy` share: ranks from kolo's job, the
    device of this rank, the sampler's arguments, no launcher of Lightning's own, and
    ``barrier``/``broadcast`` through kolo. List it before Lightning's strategy base class.

    Example::

        class MyStrategy(KoloRanks, ParallelStrategy): ...
    """

    parallel_devices: Optional[List[torch.device]]

    def _keep_optimizer_options(
        self, compression: Any, gradient_predivide_factor: float, groups: Any, sparse_as_dense: bool
    ) -> None:
        """Keeps the ``DistributedOptimizer`` arguments both strategies take."""
        self.compression = compression
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.groups = groups
        self.sparse_as_dense = bool(sparse_as_dense)

    def _distributed_optimizer(
        self, optimizer: torch.optim.Optimizer, module: torch.nn.Module, **extra: Any
    ) -> Any:
        """``optimizer`` wrapped in ``DistributedOptimizer`` with the kept options, its
        parameters named as in ``module``; ``extra`` adds arguments."""
        hvd = _hvd()
        params = {p for group in optimizer.param_groups for p in group["params"]}
        return hvd.DistributedOptimizer(
            optimizer,
            named_parameters=[(n, p) for n, p in module.named_parameters() if p in params],
            compression=self.compression or hvd.Compression.none,
            gradient_predivide_factor=self.gradient_predivide_factor,
            groups=self.groups,
            sparse_as_dense=self.sparse_as_dense,
            **extra,
        )

    @property
    def global_rank(self) -> int:
        """``hvd.rank()``."""
        return _hvd().rank()

    @property
    def local_rank(self) -> int:
        """``hvd.local_rank()``."""
        return _hvd().local_rank()

    @property
    def node_rank(self) -> int:
        """``hvd.cross_rank()``."""
        return _hvd().cross_rank()

    @property
    def world_size(self) -> int:
        """``hvd.size()``: the number of processes the launcher started."""
        return _hvd().size()

    @property
    def root_device(self) -> torch.device:
        """This process's device: the CPU, or ``cuda:<i>`` with ``i`` the Spark task's GPU
        under ``kolo.spark.run``, else the local rank (modulo the visible GPUs)."""
        return root_device(self.parallel_devices, self.local_rank)

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        """``{"num_replicas": hvd.size(), "rank": hvd.rank()}``."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _configure_launcher(self) -> None:
        # The kolo launcher started every process already.
        self._launcher = None

    def barrier(self, name: Optional[str] = None, *args: Any, **kwargs: Any) -> None:
        """``hvd.barrier()`` (every rank waits for the others)."""
        barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` (anything picklable) on every rank."""
        return broadcast(obj, src)
