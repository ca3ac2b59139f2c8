"""Horovod's ``DistributedOptimizer(..., op=hvd.Adasum)`` for torch (its
``_DistributedAdasumOptimizer``): each rank applies its own optimizer step first, and the
parameter *deltas* are combined with Adasum.

Once a parameter's gradient has been accumulated ``backward_passes_per_step`` times, its hook
runs the wrapped optimizer's step on that parameter alone, from a zero start, so the parameter
holds this rank's update ``delta = -lr * f(grad)``; an in-place Adasum allreduce of the delta
starts at once (overlapping the rest of the backward pass). ``step()`` waits for each delta and
sets the parameter to ``start + combined delta``. A parameter whose hook did not fire is
stepped and reduced in ``step()``, so every rank reduces the same tensors.

Example::

    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch

from kolo._core import Adasum
from kolo.torch._process_set_args import _process_set_kwargs
from kolo.torch.ops import allreduce_async_, synchronize


class _DistributedAdasumOptimizerMixin:
    """The methods :func:`DistributedOptimizer` adds in front of the wrapped optimizer's class
    for ``op=hvd.Adasum`` on more than one rank."""

    def __init__(
        self,
        params: Any,
        parameter_names: dict[torch.Tensor, str],
        compression: Any,
        backward_passes_per_step: int,
        process_set: Any,
    ) -> None:
        super().__init__(params)  # type: ignore[call-arg]
        self._compression = compression
        self.op = Adasum
        self.process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self._parameter_names = parameter_names
        self._allreduce_delay = {p: backward_passes_per_step for p in parameter_names}
        self._handles: dict[torch.Tensor, tuple[Optional[int], Any]] = {}
        self._hook_handles: list[Any] = []
        self._requires_update: list[torch.Tensor] = []
        # Where each parameter's step started (Horovod's _starting_models).
        self._starting_models = {
            p: torch.zeros_like(p, requires_grad=False) for p in parameter_names
        }
        self._register_hooks()

    def _register_hooks(self) -> None:
        optimizer = weakref.ref(self)
        trainable = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        trainable.sort(key=lambda p: self._parameter_names[p])
        self._requires_update = trainable
        for p in trainable:
            # As Horovod: a zero gradient to start from, so a parameter stepped in step()
            # without a backward pass moves by its optimizer's rule on a zero gradient.
            p.grad = torch.zeros_like(p)

            def hook(*_unused: Any, p: torch.Tensor = p) -> None:
                owner = optimizer()
                if owner is not None:
                    owner._on_gradient_ready(p)

            if hasattr(p, "register_post_accumulate_grad_hook"):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(hook))
            else:  # torch < 2.1: hook the gradient accumulator node, as Horovod does
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hook_handles.append(accumulator.register_hook(hook))
                self._hook_handles.append(accumulator)

    def _on_gradient_ready(self, p: torch.Tensor) -> None:
        if p in self._handles and self._handles[p][0] is not None:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step "
                    f"({self.backward_passes_per_step}) times before step(). Increase "
                    "backward_passes_per_step to accumulate gradients locally."
                )
        self._allreduce_delay[p] -= 1
        handle, context = None, None
        if self._allreduce_delay[p] == 0:
            handle, context = self._step_and_reduce(p)
        self._handles[p] = (handle, context)

    def _step_and_reduce(self, p: torch.Tensor) -> tuple[int, Any]:
        """Steps the wrapped optimizer on ``p`` alone; ``p`` then holds this rank's delta,
        whose Adasum allreduce starts."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
                super().step()  # type: ignore[misc]
                p.sub_(start)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        compressed, context = self._compression.compress(p.data)
        handle = allreduce_async_(
            compressed,
            name=f"allreduce.{self._parameter_names[p]}",
            op=Adasum,
            **_process_set_kwargs(self.process_set),
        )
        return handle, context

    def synchronize(self) -> None:
        """Nothing to do: with Adasum, ``step()`` combines the parameter deltas (Horovod).

        Example::

            optimizer.synchronize()  # a no-op with op=hvd.Adasum
        """

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Refused: Adasum steps before it reduces, so there is nothing to skip (Horovod).

        Example::

            with optimizer.skip_synchronize():  # AssertionError with op=hvd.Adasum
                optimizer.step()
        """
        raise AssertionError(
            "Skipping synchronization is not supported when using Adasum optimizer."
        )
        yield  # pragma: no cover

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Waits for every parameter's combined delta and applies it (stepping and reducing
        the parameters whose gradients did not arrive first).

        Example::

            loss.backward()
            optimizer.step()
        """
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._step_and_reduce(p)
        try:
            for p, (handle, context) in self._handles.items():
                delta = self._compression.decompress(synchronize(handle), context)
                start = self._starting_models[p]
                with torch.no_grad():
                    start.add_(delta.to(start.dtype))
                    p.copy_(start)
        finally:
            self._handles.clear()
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
        return loss

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        """Clears the gradients; refused while parameter deltas are being reduced.

        Example::

            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        """
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        return super().zero_grad(*args, **kwargs)  # type: ignore[misc]

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes accumulate locally before a step.

        Example::

            optimizer.set_backward_passes_per_step(4)
        """
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes
