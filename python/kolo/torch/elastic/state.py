"""Horovod's ``TorchState``: a model, an optimizer, samplers and plain values kept in step across
an elastic job, committed to host memory."""

from __future__ import annotations

import copy
from typing import Any

import torch

from kolo import _core
from kolo.elastic import ObjectState
from kolo.torch._objects import broadcast_object
from kolo.torch.elastic.sampler import ElasticSampler
from kolo.torch.functions import broadcast_optimizer_state, broadcast_parameters

__all__ = [
    "ModelStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "StateHandler",
    "TorchState",
    "get_handler_registry",
    "set_handler_registry",
]


def host_copy(value: Any, reuse: Any = None) -> Any:
    """A deep copy of ``value`` (a state dict) whose tensors live in host memory: a GPU tensor is
    copied to the CPU once, a CPU tensor cloned; other values are deep-copied.

    ``reuse``, a previous result for a state dict of the same layout, lends its tensors: one
    with the same shape and dtype is overwritten in place (no allocation and no first-touch
    page faults, so a commit costs about one memcpy of the state).
    """
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.device.type == "cpu"
            and reuse.shape == value.shape
            and reuse.dtype == value.dtype
            and reuse.is_contiguous()
        ):
            return reuse.copy_(value)
        return value.to("cpu", copy=True)
    if isinstance(value, dict):
        previous = reuse if isinstance(reuse, dict) else {}
        return type(value)((k, host_copy(v, previous.get(k))) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        previous = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else ()
        return type(value)(
            host_copy(v, previous[i] if previous else None) for i, v in enumerate(value)
        )
    return copy.deepcopy(value)


class StateHandler:
    """Saves, restores and syncs one kind of object tracked by a :class:`TorchState`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        """Copies the object's state as the committed state."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Puts the committed state back into the object."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Makes the object's state rank 0's."""
        raise NotImplementedError()

    def set_value(self, value: Any) -> None:
        """Tracks ``value`` instead, committing its state at once."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A ``torch.nn.Module``: its ``state_dict`` (parameters and buffers) copied to host
    memory."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.save()

    def save(self) -> None:
        """Copies the model's state dict to host memory."""
        self._saved_model_state = host_copy(
            self.value.state_dict(), getattr(self, "_saved_model_state", None)
        )

    def restore(self) -> None:
        """Loads the committed state dict into the model (copied into its tensors)."""
        self.value.load_state_dict(self._saved_model_state)

    def sync(self) -> None:
        """Broadcasts rank 0's parameters and buffers."""
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    """A ``torch.optim.Optimizer``: its ``state_dict`` copied to host memory."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(optimizer)
        self.save()

    def save(self) -> None:
        """Copies the optimizer's state dict to host memory."""
        self._saved_optimizer_state = host_copy(
            self.value.state_dict(), getattr(self, "_saved_optimizer_state", None)
        )

    def restore(self) -> None:
        """Loads a copy of the committed state dict: the optimizer may keep the tensors it is
        given (CPU ones are not copied) and update them in place, which must not change the
        commit."""
        self.value.load_state_dict(host_copy(self._saved_optimizer_state))

    def sync(self) -> None:
        """Broadcasts rank 0's optimizer state."""
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    """An :class:`ElasticSampler`: its epoch and processed count."""

    def __init__(self, sampler: ElasticSampler) -> None:
        super().__init__(sampler)
        self.save()

    def save(self) -> None:
        """Copies the sampler's state dict."""
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        """Loads the committed state dict (re-splitting the remaining indices)."""
        self.value.load_state_dict(self._saved_sampler_state)

    def sync(self) -> None:
        """Loads rank 0's sampler state on every rank, split among the current ranks."""
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


_handler_registry: list[tuple[type, type]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type]]:
    """The ``(type, handler class)`` pairs :class:`TorchState` picks handlers from, first match
    wins.

    Example::

        registry = get_handler_registry()
    """
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type]]) -> None:
    """Replaces the handler registry (e.g. to add a handler for a type of your own).

    Example::

        set_handler_registry([(MyScheduler, MySchedulerHandler), *get_handler_registry()])
    """
    global _handler_registry
    _handler_registry = registry


def _handler_for(value: Any) -> StateHandler | None:
    for handled_type, handler_cls in _handler_registry:
        if isinstance(value, handled_type):
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training process (Horovod's ``TorchState``).

    Every keyword argument becomes an attribute. Models, optimizers and
    :class:`ElasticSampler` objects (several of each are fine) are saved through their
    ``state_dict`` and synced with ``broadcast_parameters`` / ``broadcast_optimizer_state`` /
    ``broadcast_object``; any other value is a plain Python object, deep-copied on commit.
    Commits keep their copies in host memory (a GPU model is copied to the CPU), so a commit
    uses no GPU memory; ``restore()`` copies them back. After ``sync()`` the synced state is
    also the committed one.

    Args:
        model: an optional ``torch.nn.Module``.
        optimizer: an optional ``torch.optim.Optimizer``.
        kwargs: further attributes to track (e.g. ``epoch=0``, ``sampler=sampler``).

    Example::

        state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
        state.epoch += 1
        state.commit()      # copies model, optimizer, epoch and batch
        state.restore()     # back to the last commit
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.update(dict(model=model, optimizer=optimizer))
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=_core.rank, **plain)

    def save(self) -> None:
        """Commits every tracked object to host memory."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        """Puts every tracked object back to the last commit."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Makes every tracked object rank 0's, and commits the result."""
        for handler in self._handlers.values():
            handler.sync()
            handler.save()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
