"""What the PyTorch estimators' ranks train from, built on the driver: :class:`TorchSpec` (a
:class:`~kolo.estimator.spec.TrainingSpec` plus the model, optimizer, losses and functions,
cloudpickled) from an estimator's parameters (:func:`build_torch_spec`, with the checks that
make a missing or unpicklable model, optimizer or loss an
:class:`~kolo.exceptions.InvalidArgumentError` on the driver), and the trained model rebuilt
from what rank 0 returns (:func:`trained_model`). Importing this module imports neither
PySpark, Ray nor torch.

Example::

    spec = build_torch_spec(params.get, store, "run_1", meta)
    result = kolo.spark.run(TorchTrainer(spec), num_proc=2)[0]
    model = trained_model(params["model"], result["model"])
"""

from __future__ import annotations

import copy
import inspect
import io
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from kolo.estimator.checks import FIX_FN, FIX_MODEL, check_shapes, pickled
from kolo.estimator.spec import ParamGetter, TrainingSpec, spec_fields

__all__ = [
    "RemoteLossConstructor",
    "TorchSpec",
    "build_torch_spec",
    "check_loss_takes_reduction",
    "check_model_and_loss",
    "losses_from",
    "trained_model",
    "trained_optimizer",
]


@dataclass
class TorchSpec(TrainingSpec):
    """A :class:`~kolo.estimator.spec.TrainingSpec` plus the PyTorch objects, cloudpickled
    (``*_bytes``).

    Example::

        spec = build_torch_spec(params.get, store, "run_1", meta)
        spec.model_bytes, spec.optimizer_defaults
    """

    model_bytes: bytes
    optimizer_cls_bytes: bytes
    optimizer_defaults: Dict[str, Any]
    #: Hyper-parameters of each param group (without ``params``) and the indices of its
    #: parameters in ``model.parameters()``.
    optimizer_groups: List[Dict[str, Any]]
    optimizer_group_params: List[List[int]]
    losses_bytes: bytes
    loss_weights: Optional[List[float]]
    metrics_bytes: bytes
    callbacks_bytes: bytes
    transformation_fn_bytes: bytes
    train_minibatch_fn_bytes: bytes
    input_shapes: Optional[List[List[int]]]
    gradient_compression: Any
    use_gpu: bool


class RemoteLossConstructor:
    """A loss built on first use in the rank from ``constructor()`` (``loss_constructors``).

    Example::

        loss = RemoteLossConstructor(lambda: torch.nn.CrossEntropyLoss())
        value = loss(output, label)
    """

    def __init__(self, constructor: Any) -> None:
        self.constructor = constructor
        self._loss = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The loss of ``args`` (built on first use; ``reduction=`` passed on)."""
        import torch

        if self._loss is None:
            self._loss = self.constructor()
        loss = self._loss
        reduction = kwargs.pop("reduction", None)
        if reduction is not None:
            if isinstance(loss, torch.nn.modules.loss._Loss):
                loss = copy.copy(loss)
                loss.reduction = reduction
            else:
                kwargs["reduction"] = reduction
        return loss(*args, **kwargs)

    def __getstate__(self) -> Dict[str, Any]:
        return {"constructor": self.constructor, "_loss": None}


def losses_from(param: ParamGetter) -> List[Any]:
    """The losses of an estimator: ``loss_constructors`` wrapped, else ``loss`` as a list.

    Example::

        losses_from({"loss": F.cross_entropy, "loss_constructors": None}.get)
    """
    from kolo.exceptions import InvalidArgumentError

    loss = param("loss")
    constructors = param("loss_constructors")
    if constructors:
        ctors = constructors if isinstance(constructors, (list, tuple)) else [constructors]
        return [RemoteLossConstructor(c) for c in ctors]
    if loss is None:
        raise InvalidArgumentError(
            "loss is not set: pass loss=torch.nn.functional.cross_entropy (or a list, one "
            "per label column), or loss_constructors"
        )
    return list(loss) if isinstance(loss, (list, tuple)) else [loss]


def _model_and_optimizer(param: ParamGetter) -> tuple:
    """``(model, optimizer)``, or :class:`~kolo.exceptions.InvalidArgumentError` when one is
    not set."""
    from kolo.exceptions import InvalidArgumentError

    model, optimizer = param("model"), param("optimizer")
    if model is None:
        raise InvalidArgumentError("model is not set: pass model=<a torch.nn.Module>")
    if optimizer is None:
        raise InvalidArgumentError(
            "optimizer is not set: pass optimizer=torch.optim.SGD(model.parameters(), ...)"
        )
    return model, optimizer


def trained_model(model: Any, state_bytes: bytes) -> Any:
    """A copy of ``model`` with the weights a rank returned (``result["model"]``), on the CPU.

    Example::

        trained = trained_model(estimator_model, results[0]["model"])
    """
    import torch

    trained = copy.deepcopy(model)
    state = torch.load(io.BytesIO(state_bytes), map_location="cpu", weights_only=False)
    trained.load_state_dict(state)
    return trained


def _takes_reduction(loss: Any) -> bool:
    """Whether ``loss(output, label, reduction="none")`` can be called: a ``torch.nn`` loss
    module (the rank sets its ``reduction``), a loss built by a constructor (checked when it
    is built), or a callable whose signature has ``reduction`` or ``**kwargs``; a callable
    whose signature cannot be read is given the benefit of the doubt."""
    if isinstance(loss, RemoteLossConstructor):
        return True
    if type(loss).__module__.startswith("torch.nn.modules.loss"):
        return True
    try:
        signature = inspect.signature(loss)
    except (TypeError, ValueError):
        return True
    return "reduction" in signature.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    )


def trained_optimizer(optimizer: Any, state_bytes: bytes) -> Any:
    """A copy of ``optimizer`` with the state rank 0 returned (``result["optimizer"]``).

    Example::

        optimizer = trained_optimizer(estimator_optimizer, results[0]["optimizer"])
    """
    import torch

    trained = copy.deepcopy(optimizer)
    trained.load_state_dict(torch.load(io.BytesIO(state_bytes), map_location="cpu"))
    return trained


def check_loss_takes_reduction(losses: List[Any], sample_weight_col: Optional[str]) -> None:
    """With ``sample_weight_col`` each loss is called as ``loss(output, label,
    reduction="none")`` and the per-row losses are weighted (Horovod's ``calculate_loss``):
    raises :class:`~kolo.exceptions.InvalidArgumentError` on the driver, naming the loss and
    the fix, for a loss that cannot take ``reduction=`` (e.g. ``lambda out, y: ...``).

    Example::

        check_loss_takes_reduction([torch.nn.functional.mse_loss], "weight")   # fine
    """
    from kolo.exceptions import InvalidArgumentError

    if not sample_weight_col:
        return
    for index, loss in enumerate(losses):
        if not _takes_reduction(loss):
            name = getattr(loss, "__qualname__", None) or type(loss).__name__
            which = f"loss {name}" if len(losses) == 1 else f"loss {index} ({name})"
            raise InvalidArgumentError(
                f"{which} cannot take reduction=: with sample_weight_col={sample_weight_col!r} "
                "each loss is called as loss(output, label, reduction='none') and the per-row "
                "losses are weighted, as in Horovod. Give the loss a reduction argument (e.g. "
                "lambda output, label, reduction='mean': "
                "torch.nn.functional.mse_loss(output, label, reduction=reduction)), pass a "
                "torch.nn loss module (torch.nn.MSELoss()), or leave sample_weight_col unset"
            )


def check_model_and_loss(param: ParamGetter) -> None:
    """Fails before any data is written when the model, optimizer or loss is missing or cannot
    be pickled, or a loss cannot take ``reduction=`` while ``sample_weight_col`` is set
    (:class:`~kolo.exceptions.InvalidArgumentError`).

    Example::

        check_model_and_loss(params.get)
    """
    model, _ = _model_and_optimizer(param)
    pickled("model", model, FIX_MODEL)
    losses = losses_from(param)
    check_loss_takes_reduction(losses, param("sample_weight_col"))
    pickled("loss", losses, "pass loss_constructors=[fn returning the loss] instead")


def build_torch_spec(param: ParamGetter, store: Any, run_id: str, meta: Any) -> TorchSpec:
    """The :class:`TorchSpec` of an estimator's parameters (``param(name)`` gives each, by the
    Spark estimator's names) for the prepared data ``meta`` (a
    :class:`~kolo.estimator.dataset.PreparedDataset`); checks the model, optimizer, losses and
    shapes (:class:`~kolo.exceptions.InvalidArgumentError`).

    Example::

        spec = build_torch_spec(est_params.__getitem__, store, "run_1", meta)
        trainer = TorchTrainer(spec)
    """
    from kolo.exceptions import InvalidArgumentError

    model, optimizer = _model_and_optimizer(param)
    feature_cols, label_cols = param("feature_cols"), param("label_cols")
    losses = losses_from(param)
    if len(losses) not in (1, len(label_cols)):
        raise InvalidArgumentError(
            f"{len(losses)} losses for {len(label_cols)} label columns: give one loss, or "
            "one per label column"
        )
    check_shapes(param("input_shapes"), feature_cols, "input_shapes", "feature")
    fields = spec_fields(param, store, run_id, meta)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    groups, group_params = [], []
    for group in optimizer.param_groups:
        ids = []
        for p in group["params"]:
            if id(p) not in index:
                raise InvalidArgumentError(
                    "the optimizer holds a parameter that is not in the model: build it on "
                    "model.parameters() of the model passed as model="
                )
            ids.append(index[id(p)])
        groups.append({k: v for k, v in group.items() if k != "params"})
        group_params.append(ids)
    return TorchSpec(
        **fields,
        model_bytes=pickled("model", model, FIX_MODEL),
        optimizer_cls_bytes=pickled("optimizer class", type(optimizer), FIX_FN),
        optimizer_defaults=dict(optimizer.defaults),
        optimizer_groups=groups,
        optimizer_group_params=group_params,
        losses_bytes=pickled(
            "loss", losses, "pass loss_constructors=[fn returning the loss] instead"
        ),
        loss_weights=param("loss_weights"),
        metrics_bytes=pickled("metrics", param("metrics") or [], FIX_FN),
        callbacks_bytes=pickled("callbacks", param("callbacks") or [], FIX_FN),
        transformation_fn_bytes=pickled("transformation_fn", param("transformation_fn"), FIX_FN),
        train_minibatch_fn_bytes=pickled("train_minibatch_fn", param("train_minibatch_fn"), FIX_FN),
        input_shapes=param("input_shapes"),
        gradient_compression=param("gradient_compression"),
        use_gpu=param("use_gpu"),
    )
