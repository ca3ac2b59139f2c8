"""The per-rank training function of :class:`kolo.spark.torch.TorchEstimator` (Horovod's
``horovod.spark.torch.remote``).

:class:`RemoteTrainer` is built on the driver from the estimator's parameters (user objects
already cloudpickled to bytes), shipped by :func:`kolo.spark.run` and called once in every rank.
Each rank joins the job (``hvd.init()``), rebuilds the model and optimizer, takes rank 0's
weights and optimizer state (or the run's checkpoint), and trains on its equal share of the
prepared Parquet data with :class:`kolo.data.ParquetLoader`. Loss and metrics are averaged
over the ranks with one fused allreduce per step; rank 0 checkpoints after every epoch
(atomically, into ``store.get_checkpoint_path(run_id)``), writes TensorBoard logs under the
run's ``logs/`` and returns the trained weights and the history.

Example (one rank, in-process)::

    trainer = RemoteTrainer(spec)      # spec: a TrainingSpec, built by TorchEstimator
    result = trainer()                 # {"model": <state_dict bytes>, "history": {...}, ...}
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import cloudpickle

from kolo.spark.common.checks import check_rows_per_rank, check_store_writable, pickled
from kolo.spark.common.launch import (
    PROGRESS_INTERVAL_S,
    Progress,
    rank_timings,
    resume_position,
    spark_gpu_index,
    spark_send,
)

__all__ = [
    "Progress",
    "RemoteLossConstructor",
    "RemoteTrainer",
    "TrainingSpec",
    "build_training_spec",
    "check_model_and_loss",
    "check_rows_per_rank",
    "check_store_writable",
    "history_keys",
    "load_checkpoint",
    "losses_from",
    "pickled",
    "trained_model",
]

log = logging.getLogger(__name__)


@dataclass
class TrainingSpec:
    """Everything a rank needs to train; user objects are cloudpickled bytes (``*_bytes``)."""

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
    store: Any
    run_id: str
    train_path: str
    val_path: Optional[str]
    feature_cols: List[str]
    label_cols: List[str]
    sample_weight_col: Optional[str]
    input_shapes: Optional[List[List[int]]]
    label_shapes: Optional[List[List[int]]]
    batch_size: int
    val_batch_size: int
    epochs: int
    train_steps_per_epoch: Optional[int]
    validation_steps_per_epoch: Optional[int]
    shuffle: bool
    shuffle_buffer_size: Optional[int]
    random_seed: Optional[int]
    backward_passes_per_step: int
    gradient_compression: Any
    use_gpu: bool
    verbose: int
    train_reader_num_workers: int
    val_reader_num_workers: int
    storage_options: Dict[str, str] = field(default_factory=dict)


def history_keys(metric_names: Sequence[str], with_val: bool) -> List[str]:
    """The history's keys: ``train_loss``, ``train_<metric>``..., then the ``val_`` ones."""
    keys = ["train_loss", *[f"train_{m}" for m in metric_names]]
    if with_val:
        keys += ["val_loss", *[f"val_{m}" for m in metric_names]]
    return keys


def _metric_names(metrics: Sequence[Callable], label_cols: Sequence[str]) -> List[str]:
    names = []
    for fn in metrics:
        base = getattr(fn, "__name__", None) or type(fn).__name__
        if len(label_cols) == 1:
            names.append(base)
        else:
            names.extend(f"{label}_{base}" for label in label_cols)
    return names


def _serialize_checkpoint(state: Dict[str, Any]) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def load_checkpoint(store: Any, run_id: str) -> Optional[Dict[str, Any]]:
    """The checkpoint of ``run_id`` in ``store`` (``model``, ``optimizer``, ``epoch`` — the last
    finished epoch, 0-based — ``history``, ``loader``), or ``None`` when there is none.

    Example::

        ckpt = load_checkpoint(store, "run_1")
        print(ckpt["epoch"], ckpt["history"]["train_loss"])
    """
    import torch

    path = store.get_checkpoint_path(run_id)
    if path is None or not store.exists(path):
        return None
    return torch.load(io.BytesIO(store.read(path)), map_location="cpu", weights_only=False)


def _device(use_gpu: bool, local_rank: int, gpu_index: Callable[[int], int]) -> Any:
    import torch

    if not (use_gpu and torch.cuda.is_available()):
        return torch.device("cpu")
    index = gpu_index(local_rank)
    if "CUDA_VISIBLE_DEVICES" in os.environ and index >= torch.cuda.device_count():
        index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _loss_with_weights(loss_fn: Callable, output: Any, label: Any, weights: Any) -> Any:
    """Per-row losses times ``weights``, averaged (Horovod's ``calculate_loss``)."""
    import torch

    if isinstance(loss_fn, torch.nn.modules.loss._Loss):
        unreduced = copy.copy(loss_fn)
        unreduced.reduction = "none"
        per_row = unreduced(output, label)
    else:
        per_row = loss_fn(output, label, reduction="none")
    per_row = per_row.reshape(per_row.shape[0], -1).mean(dim=1)
    return (per_row * weights.reshape(-1).to(per_row.dtype)).mean()


class RemoteTrainer:
    """The function every rank runs (picklable; see the module docstring).

    The launcher-specific pieces are injected (module-level functions, so they pickle by
    reference): ``send(obj)`` delivers rank 0's progress messages (``{"kind": "step"|"epoch",
    ...}``) to the driver, best effort (default: :func:`spark_send`, through
    ``kolo.spark.task.send_to_driver``); ``gpu_index(local_rank)`` picks the CUDA device when
    ``use_gpu`` (default: :func:`spark_gpu_index`). ``kolo.ray.TorchEstimator`` passes its own.

    Example::

        trainer = RemoteTrainer(spec, send=print, gpu_index=lambda local_rank: local_rank)
    """

    def __init__(
        self,
        spec: TrainingSpec,
        send: Optional[Callable[[Any], None]] = None,
        gpu_index: Optional[Callable[[int], int]] = None,
    ) -> None:
        self.spec = spec
        self.send = send or spark_send
        self.gpu_index = gpu_index or spark_gpu_index

    # -- set-up -----------------------------------------------------------------------------

    def _build(self, hvd: Any, torch: Any) -> None:
        spec = self.spec
        if spec.random_seed is not None:
            torch.manual_seed(spec.random_seed)
        self.device = _device(spec.use_gpu, hvd.local_rank(), self.gpu_index)
        self.model = cloudpickle.loads(spec.model_bytes).to(self.device)
        params = list(self.model.parameters())
        groups = [
            {**hyper, "params": [params[i] for i in indices]}
            for hyper, indices in zip(spec.optimizer_groups, spec.optimizer_group_params)
        ]
        optimizer_cls = cloudpickle.loads(spec.optimizer_cls_bytes)
        try:
            optimizer = optimizer_cls(groups, **spec.optimizer_defaults)
        except TypeError:
            optimizer = optimizer_cls(groups)
        # Horovod: scale the learning rate by the number of ranks.
        self.base_lrs = [g.get("lr") for g in optimizer.param_groups]
        self._scale_lr(optimizer, hvd.size())
        self.losses = cloudpickle.loads(spec.losses_bytes)
        self.metrics = cloudpickle.loads(spec.metrics_bytes) or []
        self.callbacks = cloudpickle.loads(spec.callbacks_bytes) or []
        self.transformation_fn = cloudpickle.loads(spec.transformation_fn_bytes)
        self.train_minibatch_fn = cloudpickle.loads(spec.train_minibatch_fn_bytes)
        self.metric_names = _metric_names(self.metrics, spec.label_cols)
        if len(self.losses) == 1 and len(spec.label_cols) > 1:
            self.losses = self.losses * len(spec.label_cols)
        self.loss_weights = spec.loss_weights or [1.0] * len(self.losses)
        compression = spec.gradient_compression or hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=self.model.named_parameters(),
            compression=compression,
            backward_passes_per_step=spec.backward_passes_per_step,
        )

    def _scale_lr(self, optimizer: Any, factor: float) -> None:
        for group, base in zip(optimizer.param_groups, self.base_lrs):
            if base is not None:
                group["lr"] = base * factor

    def _resume(self, hvd: Any) -> Dict[str, Any]:
        """Rank 0 loads the run's checkpoint (if any) and every rank takes its state."""
        spec = self.spec
        state = None
        if hvd.rank() == 0:
            ckpt = load_checkpoint(spec.store, spec.run_id)
            if ckpt is not None:
                self.model.load_state_dict(ckpt["model"])
                self.optimizer.load_state_dict(ckpt["optimizer"])
                self._scale_lr(self.optimizer, hvd.size())
                state = {
                    "epoch": int(ckpt["epoch"]) + 1,
                    "history": ckpt["history"],
                    "loader": ckpt.get("loader"),
                }
                log.info(
                    "run %s: resuming at epoch %d from its checkpoint", spec.run_id, state["epoch"]
                )
        state = hvd.broadcast_object(state, root_rank=0, name="kolo.estimator.resume")
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        return state or {"epoch": 0, "history": None, "loader": None}

    def _loaders(self, hvd: Any) -> None:
        from kolo.data import ParquetLoader

        spec = self.spec
        columns = [*spec.feature_cols, *spec.label_cols]
        if spec.sample_weight_col and spec.sample_weight_col not in columns:
            columns.append(spec.sample_weight_col)
        self.columns = list(dict.fromkeys(columns))
        seed = 0 if spec.random_seed is None else int(spec.random_seed)
        self.train_loader = ParquetLoader(
            spec.train_path,
            self.columns,
            batch_size=spec.batch_size,
            rank=hvd.rank(),
            size=hvd.size(),
            shuffle=spec.shuffle,
            seed=seed,
            drop_last=True,
            storage_options=spec.storage_options or None,
            shuffle_buffer_size=spec.shuffle_buffer_size,
            num_threads=max(1, spec.train_reader_num_workers),
        )
        self.val_loader = None
        if spec.val_path:
            self.val_loader = ParquetLoader(
                spec.val_path,
                self.columns,
                batch_size=spec.val_batch_size,
                rank=hvd.rank(),
                size=hvd.size(),
                shuffle=False,
                seed=seed,
                drop_last=False,
                storage_options=spec.storage_options or None,
                num_threads=max(1, spec.val_reader_num_workers),
            )

    # -- one batch ----------------------------------------------------------------------------

    def _split(self, batch: Dict[str, Any]) -> tuple:
        spec = self.spec
        if self.transformation_fn is not None:
            batch = self.transformation_fn(batch)
        device = self.device
        inputs = [batch[c].to(device, non_blocking=True) for c in spec.feature_cols]
        if spec.input_shapes:
            inputs = [x.reshape(s) for x, s in zip(inputs, spec.input_shapes)]
        inputs = [x.float() if x.dtype == self._float64 else x for x in inputs]
        labels = [batch[c].to(device, non_blocking=True) for c in spec.label_cols]
        labels = [y.float() if y.dtype == self._float64 else y for y in labels]
        if spec.label_shapes:
            labels = [y.reshape(s) for y, s in zip(labels, spec.label_shapes)]
        weights = None
        if spec.sample_weight_col:
            weights = batch[spec.sample_weight_col].to(device)
        return inputs, labels, weights

    @staticmethod
    def _transform_outputs(outputs: Any, labels: List[Any]) -> tuple:
        """Outputs as a list; a floating label with one dimension fewer than its output of
        several values per row (class indices, e.g. from StringIndexer) becomes int64."""
        if not isinstance(outputs, (tuple, list)):
            outputs = [outputs]
        outputs = list(outputs)
        labels = [
            label.long()
            if label.is_floating_point()
            and label.dim() == output.dim() - 1
            and output.dim() > 1
            and output.shape[-1] > 1
            else label
            for output, label in zip(outputs, labels)
        ]
        return outputs, labels

    def _loss(self, outputs: List[Any], labels: List[Any], weights: Any) -> Any:
        total = None
        for output, label, loss_fn, w in zip(outputs, labels, self.losses, self.loss_weights):
            if weights is None:
                value = loss_fn(output, label)
            else:
                value = _loss_with_weights(loss_fn, output, label, weights)
            total = value * w if total is None else total + value * w
        return total

    def _metric_values(self, outputs: List[Any], labels: List[Any]) -> List[Any]:
        import torch

        values = []
        for fn in self.metrics:
            for output, label in zip(outputs, labels):
                value = fn(output.detach(), label)
                values.append(torch.as_tensor(value, dtype=torch.float64).reshape(()))
        return values

    # -- epochs -------------------------------------------------------------------------------

    def _batches(self, loader: Any, steps: int) -> Iterator[Dict[str, Any]]:
        """Exactly ``steps`` batches, going on into the loader's next epoch when needed."""
        done = 0
        while done < steps:
            for batch in loader:
                yield batch
                done += 1
                if done >= steps:
                    return

    def _call(self, name: str, *args: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, name, None)
            if method is not None:
                method(*args)

    def _run_epoch(self, hvd: Any, torch: Any, epoch: int, train: bool) -> Dict[str, float]:
        spec = self.spec
        loader = self.train_loader if train else self.val_loader
        if train:
            steps = spec.train_steps_per_epoch or len(loader)
        else:
            steps = spec.validation_steps_per_epoch or len(loader)
        prefix = "train" if train else "val"
        self.model.train(train)
        passes = spec.backward_passes_per_step
        totals = None
        pending = None
        last_report = time.monotonic()
        if train and hvd.rank() == 0:
            self.send({"kind": "step", "epoch": epoch, "step": 0, "steps": steps})
        grad = contextlib.nullcontext() if train else torch.no_grad()
        with grad:
            for step, batch in enumerate(self._batches(loader, steps)):
                inputs, labels, weights = self._split(batch)
                if train and self.train_minibatch_fn is not None:
                    outputs, loss = self.train_minibatch_fn(
                        self.model,
                        self.optimizer,
                        self._transform_outputs,
                        self._loss,
                        inputs,
                        labels,
                        weights,
                    )
                    outputs, labels = self._transform_outputs(outputs, labels)
                elif train:
                    if step % passes == 0:
                        self.optimizer.zero_grad()
                    outputs, labels = self._transform_outputs(self.model(*inputs), labels)
                    loss = self._loss(outputs, labels, weights)
                    (loss / passes if passes > 1 else loss).backward()
                    if (step + 1) % passes == 0 or step + 1 == steps:
                        self.optimizer.step()
                else:
                    outputs, labels = self._transform_outputs(self.model(*inputs), labels)
                    loss = self._loss(outputs, labels, weights)
                # One fused allreduce per step: the loss and every metric in one tensor,
                # pipelined (the previous step's result is collected before submitting).
                values = torch.stack(
                    [loss.detach().to(torch.float64).reshape(()).cpu()]
                    + [v.cpu() for v in self._metric_values(outputs, labels)]
                )
                if pending is not None:
                    reduced = hvd.synchronize(pending)
                    totals = reduced if totals is None else totals + reduced
                pending = hvd.allreduce_async(values, name=f"kolo.metrics.{prefix}")
                if train:
                    self._call("on_train_batch_end", step, {"epoch": epoch})
                    now = time.monotonic()
                    if hvd.rank() == 0 and now - last_report >= PROGRESS_INTERVAL_S:
                        last_report = now
                        self.send(
                            {"kind": "step", "epoch": epoch, "step": step + 1, "steps": steps}
                        )
            if pending is not None:
                reduced = hvd.synchronize(pending)
                totals = reduced if totals is None else totals + reduced
        means = (totals / max(steps, 1)).tolist() if totals is not None else []
        names = ["loss", *self.metric_names]
        return {f"{prefix}_{n}": float(v) for n, v in zip(names, means)}

    def _checkpoint(self, hvd: Any, epoch: int, history: Dict[str, List[float]]) -> None:
        spec = self.spec
        if hvd.rank() != 0 or spec.store.get_checkpoint_path(spec.run_id) is None:
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": epoch,
            "history": history,
            "loader": self.train_loader.state_dict(),
            "size": hvd.size(),
        }
        spec.store.write_bytes(
            spec.store.get_checkpoint_path(spec.run_id), _serialize_checkpoint(state)
        )

    # -- the rank's function ------------------------------------------------------------------

    def __call__(self) -> Optional[Dict[str, Any]]:
        import torch

        import kolo.torch as hvd

        started, started_unix = time.monotonic(), time.time()
        hvd.init()
        self._float64 = torch.float64
        self._build(hvd, torch)
        self._loaders(hvd)
        resume = self._resume(hvd)
        start_epoch, history = resume_position(self.train_loader, resume)
        timings = rank_timings(started, started_unix)
        writer, local_dir, sync = self._tensorboard(hvd)
        try:
            for epoch in range(start_epoch, self.spec.epochs):
                self._call("on_epoch_begin", epoch, None)
                t0 = time.monotonic()
                if timings["first_step_unix"] is None:
                    timings["first_step_unix"] = time.time()
                logs = self._run_epoch(hvd, torch, epoch, train=True)
                if self.val_loader is not None:
                    logs.update(self._run_epoch(hvd, torch, epoch, train=False))
                for key, value in logs.items():
                    history.setdefault(key, []).append(value)
                timings["train_s"] += time.monotonic() - t0
                t1 = time.monotonic()
                self._checkpoint(hvd, epoch, history)
                timings["checkpoint_s"] += time.monotonic() - t1
                if writer is not None:
                    for key, value in logs.items():
                        writer.add_scalar(key, value, epoch)
                    writer.flush()
                    sync(local_dir)
                self._call("on_epoch_end", epoch, dict(logs))
                if hvd.rank() == 0:
                    self.send(
                        {
                            "kind": "epoch",
                            "epoch": epoch,
                            "epochs": self.spec.epochs,
                            "metrics": logs,
                        }
                    )
                if self.spec.verbose >= 2:
                    log.info("rank %d epoch %d: %s", hvd.rank(), epoch, logs)
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    sync(local_dir)
            if local_dir is not None:
                import shutil

                shutil.rmtree(local_dir, ignore_errors=True)
            self.train_loader.close()
            if self.val_loader is not None:
                self.val_loader.close()
        if hvd.rank() != 0:
            return None
        self._scale_lr(self.optimizer, 1.0)
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        model_bytes = _serialize_checkpoint(state)
        timings["returned_unix"] = time.time()
        return {
            "model": model_bytes,
            "history": history,
            "start_epoch": start_epoch,
            "size": hvd.size(),
            "timings": timings,
        }

    def _tensorboard(self, hvd: Any) -> tuple:
        spec = self.spec
        if hvd.rank() != 0 or spec.store.get_logs_path(spec.run_id) is None:
            return None, None, None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.info("tensorboard is not installed: no event logs for run %s", spec.run_id)
            return None, None, None
        import tempfile

        local_dir = tempfile.mkdtemp(prefix="kolo-run-")
        logs_dir = os.path.join(local_dir, spec.store.get_logs_subdir())
        writer = SummaryWriter(log_dir=logs_dir)
        return writer, local_dir, spec.store.sync_fn(spec.run_id)


# -- driver side, shared by kolo.spark.torch.TorchEstimator and kolo.ray.TorchEstimator -------


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


#: ``param(name)``: the value of an estimator parameter (``loss``, ``batch_size``, ...).
ParamGetter = Callable[[str], Any]

_FIX_FN = "define it at module level, or keep locks, open files and sessions out of it"


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


def check_model_and_loss(param: ParamGetter) -> None:
    """Fails before any data is written when the model, optimizer or loss is missing or cannot
    be pickled (:class:`~kolo.exceptions.InvalidArgumentError`).

    Example::

        check_model_and_loss(params.get)
    """
    model, _ = _model_and_optimizer(param)
    pickled("model", model, "keep locks, open files, sessions and the like out of the model")
    pickled("loss", losses_from(param), "pass loss_constructors=[fn returning the loss] instead")


def build_training_spec(
    param: ParamGetter,
    store: Any,
    run_id: str,
    train_path: str,
    val_path: Optional[str],
) -> TrainingSpec:
    """The :class:`TrainingSpec` of an estimator's parameters (``param(name)`` gives each, by
    the Spark estimator's names) for data at ``train_path`` (and ``val_path``); checks the
    model, optimizer, losses and shapes (:class:`~kolo.exceptions.InvalidArgumentError`).

    Example::

        spec = build_training_spec(est_params.__getitem__, store, "run_1",
                                   meta.train_path, meta.val_path)
        trainer = RemoteTrainer(spec)
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
    input_shapes, label_shapes = param("input_shapes"), param("label_shapes")
    if input_shapes is not None and len(input_shapes) != len(feature_cols):
        raise InvalidArgumentError(
            f"input_shapes has {len(input_shapes)} shapes for {len(feature_cols)} feature "
            "columns: give one shape per feature column"
        )
    if label_shapes is not None and len(label_shapes) != len(label_cols):
        raise InvalidArgumentError(
            f"label_shapes has {len(label_shapes)} shapes for {len(label_cols)} label "
            "columns: give one shape per label column"
        )
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
    val_batch = param("val_batch_size") or param("batch_size")
    options = store.native_location()[1] if hasattr(store, "native_location") else {}
    return TrainingSpec(
        model_bytes=pickled(
            "model", model, "keep locks, open files, sessions and the like out of the model"
        ),
        optimizer_cls_bytes=pickled("optimizer class", type(optimizer), _FIX_FN),
        optimizer_defaults=dict(optimizer.defaults),
        optimizer_groups=groups,
        optimizer_group_params=group_params,
        losses_bytes=pickled(
            "loss", losses, "pass loss_constructors=[fn returning the loss] instead"
        ),
        loss_weights=param("loss_weights"),
        metrics_bytes=pickled("metrics", param("metrics") or [], _FIX_FN),
        callbacks_bytes=pickled("callbacks", param("callbacks") or [], _FIX_FN),
        transformation_fn_bytes=pickled("transformation_fn", param("transformation_fn"), _FIX_FN),
        train_minibatch_fn_bytes=pickled(
            "train_minibatch_fn", param("train_minibatch_fn"), _FIX_FN
        ),
        store=store,
        run_id=run_id,
        train_path=train_path,
        val_path=val_path,
        feature_cols=list(feature_cols),
        label_cols=list(label_cols),
        sample_weight_col=param("sample_weight_col"),
        input_shapes=input_shapes,
        label_shapes=label_shapes,
        batch_size=param("batch_size"),
        val_batch_size=val_batch,
        epochs=param("epochs"),
        train_steps_per_epoch=param("train_steps_per_epoch"),
        validation_steps_per_epoch=param("validation_steps_per_epoch"),
        shuffle=param("shuffle"),
        shuffle_buffer_size=param("shuffle_buffer_size"),
        random_seed=param("random_seed"),
        backward_passes_per_step=param("backward_passes_per_step"),
        gradient_compression=param("gradient_compression"),
        use_gpu=param("use_gpu"),
        verbose=param("verbose"),
        train_reader_num_workers=param("train_reader_num_workers"),
        val_reader_num_workers=param("val_reader_num_workers"),
        storage_options=dict(options),
    )
