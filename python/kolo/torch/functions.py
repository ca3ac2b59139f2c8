"""Whole-model helpers: Horovod's ``broadcast_parameters`` and ``broadcast_optimizer_state``
(and, from ``kolo.torch._objects``, ``broadcast_object`` and ``allgather_object``, which
Horovod also keeps in its ``functions`` module)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

import torch

from kolo import _core
from kolo.torch._objects import allgather_object, broadcast_object
from kolo.torch._process_set_args import _process_set_kwargs
from kolo.torch.ops import broadcast_async_, synchronize
from kolo.torch.optimizer import _DistributedOptimizerMixin

__all__ = [
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
]


def broadcast_parameters(params: Any, root_rank: int, process_set: Any = None) -> None:
    """Overwrites every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a ``model.state_dict()`` (or any dict of tensors), ``model.named_parameters()``
    or ``model.parameters()``. All broadcasts are started at once and then awaited.

    Example::

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, torch.Tensor)):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(
            f"broadcast_parameters takes a dict of tensors (state_dict()) or a list of tensors "
            f"or (name, tensor) pairs, got {type(params).__name__}"
        )
    ps = _process_set_kwargs(process_set)
    handles = []
    # Tied weights appear once per name in a state_dict; broadcasting the same memory twice at
    # once is refused by the engine (two in-flight ops may not write the same bytes), and the
    # first broadcast fills every alias anyway. The same on every rank: the models match.
    seen: set[tuple[int, int]] = set()
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"broadcast_parameters: {name or 'an entry'} is a {type(tensor).__name__}, "
                "not a tensor; use broadcast_object for other values"
            )
        memory = (tensor.data_ptr(), tensor.nbytes)
        if tensor.nbytes and memory in seen:
            continue
        seen.add(memory)
        op_name = None if name is None else f"broadcast.{name}"
        handles.append(broadcast_async_(tensor.detach(), root_rank, name=op_name, **ps))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int,
    model: Optional[torch.nn.Module] = None,
    process_set: Any = None,
) -> None:
    """Makes every rank's optimizer state (hyperparameters and per-parameter state such as
    momentum buffers) equal to ``root_rank``'s, in place. Horovod's signature:
    ``(optimizer, root_rank, model=None)``; ``process_set`` is kolo's addition.

    An optimizer that has not stepped yet gets its state created first by a step with zero
    gradients (as Horovod does), also for parameters that have no gradient yet; the parameters
    and the gradients they had are restored afterwards, and a trainable parameter that had no
    gradient keeps a zero one (as in Horovod). ``model`` names the
    parameters of sparse ``torch.nn.Embedding`` layers, whose zero gradients are then sparse
    for ``torch.optim.SGD`` (as ``torch.optim.SparseAdam`` always gets). Works for plain
    optimizers and for :func:`DistributedOptimizer` (that step does not communicate).

    Example::

        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state (its state is deeply nested)")
    if not optimizer.state:
        _create_state(optimizer, _sparse_parameters(model))

    # The root describes its state: plain values travel in this object, tensors are then
    # broadcast in place into the matching tensors (created where a rank lacks them).
    groups = optimizer.param_groups
    description = None
    if _core.rank() == root_rank:
        description = {
            "options": [{k: v for k, v in g.items() if k != "params"} for g in groups],
            "state": [
                [
                    {
                        key: (("tensor", tuple(v.shape), v.dtype) if torch.is_tensor(v) else v)
                        for key, v in optimizer.state.get(p, {}).items()
                    }
                    for p in g["params"]
                ]
                for g in groups
            ],
        }
    description = broadcast_object(
        description, root_rank, name="broadcast_optimizer_state", process_set=process_set
    )

    mismatch = None
    if len(description["state"]) != len(groups) or any(
        len(root) != len(g["params"]) for root, g in zip(description["state"], groups)
    ):
        mismatch = (
            f"rank {_core.rank()}'s optimizer has parameter groups of sizes "
            f"{[len(g['params']) for g in groups]}, rank {root_rank}'s "
            f"{[len(s) for s in description['state']]}; construct the same optimizer on every rank"
        )
    tensors: list[tuple[str, torch.Tensor]] = []
    for gi, root_group in enumerate(description["state"]):
        group_params = groups[gi]["params"] if gi < len(groups) else []
        for pi, root_state in enumerate(root_group):
            param = group_params[pi] if pi < len(group_params) else None
            if param is not None and not root_state:
                optimizer.state.pop(param, None)  # the root has no state for it either
            state = optimizer.state[param] if param is not None and root_state else {}
            for key in [k for k in state if k not in root_state]:
                del state[key]
            for key, value in root_state.items():
                if isinstance(value, tuple) and len(value) == 3 and value[0] == "tensor":
                    _, shape, dtype = value
                    local = state.get(key)
                    if not (
                        torch.is_tensor(local)
                        and tuple(local.shape) == shape
                        and local.dtype == dtype
                    ):
                        device = param.device if param is not None and len(shape) else "cpu"
                        local = torch.zeros(shape, dtype=dtype, device=device)
                        state[key] = local
                    tensors.append((f"optimizer.{gi}.{pi}.{key}", local))
                else:
                    state[key] = value
    broadcast_parameters(tensors, root_rank, process_set=process_set)
    if mismatch is not None:
        raise ValueError(mismatch)
    for group, options in zip(groups, description["options"]):
        group.update(options)


def _sparse_parameters(model: Optional[torch.nn.Module]) -> set[int]:
    """The ids of the parameters of ``model``'s sparse embeddings (none without a model)."""
    if model is None:
        return set()
    return {
        id(p)
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and m.sparse
        for p in m.parameters()
    }


def _create_state(optimizer: torch.optim.Optimizer, sparse_params: set[int]) -> None:
    """Runs one step with zero gradients so the optimizer creates its per-parameter state,
    then restores the parameters, and the gradients they had. A parameter that had no gradient
    keeps a zero one, as Horovod leaves it (its tests broadcast that gradient afterwards).
    Gradients are sparse for SparseAdam, and for SGD on ``sparse_params``."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    sparse_adam = isinstance(optimizer, torch.optim.SparseAdam)
    sgd = isinstance(optimizer, torch.optim.SGD)

    def zero_grad(p: torch.Tensor) -> torch.Tensor:
        zeros = torch.zeros_like(p)
        return zeros.to_sparse() if sparse_adam or (sgd and id(p) in sparse_params) else zeros

    for p in params:
        p.grad = zero_grad(p)
    try:
        if isinstance(optimizer, _DistributedOptimizerMixin):
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
    finally:
        with torch.no_grad():
            for p, value, grad in saved:
                p.copy_(value)
                p.grad = zero_grad(p) if grad is None else grad
