"""Horovod's ``DistributedOptimizer``: gradients are averaged across ranks while backward runs.

Each parameter gets a hook that fires once its gradient has been accumulated; after
``backward_passes_per_step`` such passes the hook starts an asynchronous allreduce of that
gradient, so communication overlaps the rest of the backward pass. ``step()`` (or an explicit
``synchronize()``) waits for the outstanding allreduces and writes the averaged gradients back
before the wrapped optimizer updates the weights.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional, Union

import torch

from kolo import _core
from kolo._core import Adasum, Average, resolve_op
from kolo._env import elastic_launch
from kolo.process_sets import resolve
from kolo.torch._adasum_optimizer import _DistributedAdasumOptimizerMixin
from kolo.torch._objects import broadcast_object
from kolo.torch._process_set_args import _process_set_included, _process_set_kwargs
from kolo.torch.compression import Compression
from kolo.torch.ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)

__all__ = ["DistributedOptimizer"]

_Group = tuple[torch.Tensor, ...]


class _Pending:
    """One started reduction: the handle, one compression context per tensor, and whether each
    gradient was sparse (and so is written back as sparse)."""

    __slots__ = ("contexts", "handle", "sparse")

    def __init__(self, handle: Union[int, Callable[[], Any]], contexts: list, sparse: list) -> None:
        self.handle = handle
        self.contexts = contexts
        self.sparse = sparse


class _DistributedOptimizerMixin:
    """The methods :func:`DistributedOptimizer` adds in front of the wrapped optimizer's class."""

    def __init__(
        self,
        params: Any,
        named_parameters: Optional[list[tuple[str, torch.Tensor]]],
        compression: Any,
        backward_passes_per_step: int,
        op: Any,
        gradient_predivide_factor: float,
        groups: Any,
        sparse_as_dense: bool,
        process_set: Any,
    ) -> None:
        super().__init__(params)  # type: ignore[call-arg]
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step

        names = _parameter_names(self.param_groups, named_parameters)
        self._parameter_names: dict[torch.Tensor, str] = names
        self._allreduce_delay = {p: backward_passes_per_step for p in names}
        self._groups_spec = _validate_groups(groups)

        self._pending: dict[_Group, _Pending] = {}
        self._touched: set[torch.Tensor] = set()
        self._group_counts: dict[_Group, int] = {}
        self._p_to_group: dict[torch.Tensor, _Group] = {}
        self._group_order: list[_Group] = []
        self._hook_handles: list[Any] = []
        self._requires_update: list[torch.Tensor] = []
        self._synchronized = False
        self._should_synchronize = True

        # As Horovod: an elastic job (HOROVOD_ELASTIC=1 from kolorun's elastic launch,
        # KOLO_ELASTIC_TIMEOUT from every elastic driver) may start with one rank and grow, so
        # the hooks are needed at any size.
        if _process_set_included(process_set) and (_core.size() > 1 or elastic_launch()):
            self._register_hooks()

    # --- setup ---------------------------------------------------------------------------------

    def _register_hooks(self) -> None:
        trainable = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        # Reductions are named per parameter, so the order only matters for forming groups and
        # for the reductions synchronize() starts itself: use the sorted names, the same on
        # every rank.
        trainable.sort(key=lambda p: self._parameter_names[p])
        self._requires_update = trainable
        if self._groups_spec is None:
            groups = [(p,) for p in trainable]
        else:
            groups = self._form_groups(trainable)
        for group in groups:
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0
        self._group_order = groups

        for p in trainable:
            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))
            else:  # torch < 2.1: hook the gradient accumulator node, as Horovod does
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(accumulator.register_hook(self._make_hook(p)))
                self._hook_handles.append(accumulator)  # keep the node alive

    def _form_groups(self, trainable: list[torch.Tensor]) -> list[_Group]:
        # Every rank must form the same groups: take rank 0's parameter order (Horovod does too).
        order = broadcast_object(
            [self._parameter_names[p] for p in trainable],
            root_rank=0,
            name="DistributedOptimizer.groups",
            **_process_set_kwargs(self.process_set),
        )
        position = {name: i for i, name in enumerate(order)}
        trainable = sorted(trainable, key=lambda p: position.get(self._parameter_names[p], -1))
        if isinstance(self._groups_spec, int):
            return [tuple(chunk) for chunk in _split(trainable, self._groups_spec) if chunk]
        wanted = {id(p) for p in trainable}
        groups: list[_Group] = []
        grouped: set[int] = set()
        for spec in self._groups_spec:
            members = tuple(p for p in spec if id(p) in wanted)
            if members:
                groups.append(members)
                grouped.update(id(p) for p in members)
        groups.extend((p,) for p in trainable if id(p) not in grouped)
        return groups

    # --- the hook and the reductions -----------------------------------------------------------

    def _make_hook(self, p: torch.Tensor) -> Callable[..., None]:
        # The parameter outlives a discarded optimizer: hold it weakly, so a replaced wrapper
        # is collected and its hooks go quiet instead of starting reductions nobody awaits.
        optimizer = weakref.ref(self)

        def hook(*_unused: Any) -> None:
            owner = optimizer()
            if owner is not None:
                owner._on_gradient_ready(p)

        return hook

    def _on_gradient_ready(self, p: torch.Tensor) -> None:
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step "
                f"({self.backward_passes_per_step}) times before step() or synchronize(). "
                "Increase backward_passes_per_step to accumulate gradients locally."
            )
        if p.grad is not None and p.grad.requires_grad:
            raise AssertionError(
                "DistributedOptimizer cannot reduce gradients that require grad "
                "(backward(create_graph=True)); call optimizer.synchronize() after computing "
                "higher-order gradients with torch.autograd.grad instead"
            )
        self._touched.add(p)
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            group = self._p_to_group[p]
            self._group_counts[group] += 1
            if self._group_counts[group] == len(group):
                self._start(group)

    def _scale_factors(self) -> tuple[float, float]:
        # Average: split the division across the sum (the engine divides by size after it).
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _start(self, group: _Group) -> None:
        """Starts the reduction of ``group``'s gradients (missing gradients count as zeros)."""
        for p in group:
            if p.grad is None:
                # Another rank may have a gradient for it (a branch this rank skipped): send zeros
                # so every rank reduces the same tensors.
                p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
        prescale, postscale = self._scale_factors()
        ps_kwargs = _process_set_kwargs(self.process_set)
        sparse = [p.grad.is_sparse for p in group]
        if len(group) == 1 and self._groups_spec is None:
            p = group[0]
            name = f"allreduce.{self._parameter_names[p]}"
            if sparse[0] and not self.sparse_as_dense:
                handle = sparse_allreduce_async(p.grad, name=name, op=self.op, **ps_kwargs)
                self._pending[group] = _Pending(handle, [None], sparse)
                return
            tensor = p.grad.to_dense() if sparse[0] else p.grad
            compressed, context = self._compression.compress(tensor)
            handle = allreduce_async_(
                compressed,
                name=name,
                op=self.op,
                prescale_factor=prescale,
                postscale_factor=postscale,
                **ps_kwargs,
            )
            self._pending[group] = _Pending(handle, [context], sparse)
            return
        # Grouped reductions are dense (Horovod's sparse_as_dense for groups).
        compressed_list, contexts = [], []
        for p in group:
            compressed, context = self._compression.compress(
                p.grad.to_dense() if p.grad.is_sparse else p.grad
            )
            compressed_list.append(compressed)
            contexts.append(context)
        handle = grouped_allreduce_async_(
            compressed_list,
            name=f"grouped_allreduce.{self._parameter_names[group[0]]}",
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            **ps_kwargs,
        )
        self._pending[group] = _Pending(handle, contexts, sparse)

    # --- public methods ------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Waits for every gradient's allreduce and writes the averaged gradients back.

        Starts the reductions that have not started yet (parameters whose gradient did not
        arrive ``backward_passes_per_step`` times, or that this rank did not use at all), so every
        rank reduces the same tensors. ``step()`` calls it unless inside
        :meth:`skip_synchronize`. When a reduction fails, it raises that error after the others
        finished (their gradients averaged), and the next step starts clean.

        Example::

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        if not _process_set_included(self.process_set):
            self._synchronized = True
            return
        for group in self._group_order:
            if group not in self._pending:
                self._start(group)
        first_error: Optional[Exception] = None
        try:
            # A failed reduction raises once the others are finished too: none is left running
            # into the next step's gradients (nor holding its tensor in the engine for ever).
            for group, pending in self._pending.items():
                try:
                    self._finish(group, pending)
                except Exception as error:
                    first_error = first_error or error
            if first_error is not None:
                raise first_error
        finally:
            self._pending.clear()
            self._touched.clear()
            for group in self._group_counts:
                self._group_counts[group] = 0
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
        self._synchronized = True

    def _finish(self, group: _Group, pending: _Pending) -> None:
        if callable(pending.handle):
            outputs = [pending.handle()]
        else:
            result = synchronize(pending.handle)
            outputs = list(result) if isinstance(result, (list, tuple)) else [result]
        for p, output, context, was_sparse in zip(group, outputs, pending.contexts, pending.sparse):
            reduced = (
                self._compression.decompress(output, context) if context is not None else output
            )
            if was_sparse:
                p.grad = reduced if reduced.is_sparse else reduced.to_sparse()
            elif reduced.data_ptr() != p.grad.data_ptr() or reduced.dtype != p.grad.dtype:
                with torch.no_grad():
                    p.grad.copy_(reduced)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Makes ``step()`` skip its ``synchronize()`` (after you called it yourself).

        Example::

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Synchronizes the gradients (unless in :meth:`skip_synchronize`), then steps.

        Example::

            loss.backward()
            optimizer.step()
        """
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(); this reduces the gradients twice. Wrap step() in "
                    "`with optimizer.skip_synchronize():` after calling synchronize() yourself.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Clears the gradients; refused while gradient reductions are outstanding.

        Example::

            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """
        if self._pending or self._touched:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); the running gradient allreduces "
                "would race with it. Call zero_grad() before backward() or after step()."
            )
        return super().zero_grad(*args, **kwargs)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes accumulate locally before a reduction.

        Example::

            optimizer.set_backward_passes_per_step(4)
        """
        self.backward_passes_per_step = _validate_passes(passes)
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        """Loads optimizer state and forgets any outstanding reductions.

        Example::

            optimizer.load_state_dict(checkpoint["optimizer"])
        """
        self._pending.clear()
        self._touched.clear()
        self._synchronized = False
        self._should_synchronize = True
        for group in self._group_counts:
            self._group_counts[group] = 0
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super().load_state_dict(*args, **kwargs)  # type: ignore[misc]


def _parameter_names(
    param_groups: list[dict[str, Any]], named_parameters: Any
) -> dict[torch.Tensor, str]:
    if named_parameters is None:
        return {
            p: f"noname.{i}.{j}"
            for i, group in enumerate(param_groups)
            for j, p in enumerate(group["params"])
        }
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError(
            "named_parameters should be a sequence of (name, parameter) tuples, usually "
            "model.named_parameters()"
        )
    seen: set[str] = set()
    duplicates: set[str] = set()
    for name, _ in named:
        if name in seen:
            duplicates.add(name)
        seen.add(name)
    if duplicates:
        raise ValueError(
            "Parameter names in named_parameters must be unique. Found duplicates: "
            + ", ".join(sorted(duplicates))
        )
    named_ids = {id(p) for _, p in named}
    unnamed = [p for group in param_groups for p in group["params"] if id(p) not in named_ids]
    if unnamed:
        shapes = ", ".join(str(tuple(p.shape)) for p in unnamed)
        raise ValueError(
            "named_parameters was given, but the optimizer has parameters it does not name "
            f"(shapes {shapes}); pass model.named_parameters() of the model the optimizer trains"
        )
    optimized = {id(p) for group in param_groups for p in group["params"]}
    return {p: name for name, p in named if id(p) in optimized}


def _validate_groups(groups: Any) -> Any:
    if groups is None:
        return None
    if isinstance(groups, bool) or not isinstance(groups, (int, list)):
        raise ValueError("groups should be a positive integer or a list of lists of parameters")
    if isinstance(groups, int):
        if groups <= 0:
            raise ValueError(f"groups should be a positive integer, got {groups}")
        return groups
    seen: set[int] = set()
    for group in groups:
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError("groups must consist of torch.Tensor parameters")
            if id(p) in seen:
                raise ValueError("A parameter can only appear once in groups")
            seen.add(id(p))
    return [list(group) for group in groups]


def _validate_passes(passes: Any) -> int:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}")
    return passes


def _split(items: list[Any], parts: int) -> Iterable[list[Any]]:
    """``items`` in ``parts`` consecutive chunks whose lengths differ by at most one."""
    base, extra = divmod(len(items), parts)
    start = 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        yield items[start:end]
        start = end


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so ``step()`` applies gradients averaged over all ranks.

    The result is an instance of a subclass of ``optimizer``'s class (``isinstance`` checks,
    ``param_groups``, ``state_dict()`` and LR schedulers keep working) built on the same
    parameter groups; the wrapped optimizer's state carries over. Each gradient's allreduce
    starts as soon as backward has produced it, overlapping the rest of the backward pass.

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()``; names the reductions
            (``allreduce.<name>``). Without it parameters are named by position.
        compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16``; applied to each gradient
            on the wire.
        backward_passes_per_step: backward passes accumulated locally (summed, as in Horovod;
            scale the loss by ``1 / backward_passes_per_step`` for a mean) before one allreduce.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``. With Adasum on more
            than one rank (a power of two), each rank applies its own optimizer step and the
            parameter deltas are combined with Adasum, as in Horovod: ``synchronize()`` does
            nothing and ``skip_synchronize()`` is refused; use the learning rate of one rank.
        gradient_predivide_factor: with Average, gradients are scaled by
            ``1 / gradient_predivide_factor`` before the sum and by
            ``gradient_predivide_factor / size`` after it.
        num_groups: deprecated alias of an integer ``groups``.
        groups: an integer number of groups to split the parameters into, or a list of lists
            of parameters; each group is reduced with one grouped allreduce.
        sparse_as_dense: reduce sparse gradients as dense tensors (then sparse again).
        process_set: reduce over this ``kolo.ProcessSet`` only (default: every rank).

    Example::

        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters()
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if isinstance(optimizer, (_DistributedOptimizerMixin, _DistributedAdasumOptimizerMixin)):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap it only once")
    reduce_op = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and reduce_op != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=hvd.Average")
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups=", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    passes = _validate_passes(backward_passes_per_step)

    base = optimizer.__class__
    if reduce_op is Adasum and _core.size() > 1 and _process_set_included(process_set):
        _core.check_adasum(resolve(process_set).size() or _core.size())
        names = _parameter_names(optimizer.param_groups, named_parameters)
        cls = type(
            base.__name__, (_DistributedAdasumOptimizerMixin, base), {"__module__": __name__}
        )
        wrapped = cls(optimizer.param_groups, names, compression, passes, process_set)
        for p, state in optimizer.state.items():
            wrapped.state[p] = state
        return wrapped
    cls = type(base.__name__, (_DistributedOptimizerMixin, base), {"__module__": __name__})
    wrapped = cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        passes,
        reduce_op,
        float(gradient_predivide_factor),
        groups,
        bool(sparse_as_dense),
        process_set,
    )
    for p, state in optimizer.state.items():
        wrapped.state[p] = state
    return wrapped
