"""The PyTorch estimators' per-rank training loop (Horovod's ``horovod.spark.torch.remote``),
launcher-neutral: :class:`kolo.spark.torch.TorchEstimator` runs it under :func:`kolo.spark.run`,
:class:`kolo.ray.TorchEstimator` on a :class:`kolo.ray.RayExecutor`.

:class:`TorchTrainer` is built on the driver from the estimator's parameters
(:func:`~kolo.estimator.torch_spec.build_torch_spec`; user objects already cloudpickled to
bytes), shipped by the launcher and called once in every rank. Each rank joins the job
(``hvd.init()``), rebuilds the model and optimizer, takes rank 0's weights and optimizer state
(or the run's checkpoint), and trains on its equal share of the prepared Parquet data with
:class:`kolo.data.ParquetLoader`. Loss and metrics are averaged over the ranks with one fused
allreduce per step; rank 0 checkpoints after every epoch (atomically, into the run's checkpoint
file, :func:`~kolo.estimator.spec.checkpoint_file`), writes TensorBoard logs under the run's
``logs/`` and returns the trained weights and the history.

Example (one rank, in-process)::

    trainer = TorchTrainer(spec)       # spec: a TorchSpec, built by build_torch_spec
    result = trainer()                 # {"model": <state_dict bytes>, "history": {...}, ...}
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import sys
import time
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import cloudpickle

from kolo._env import elastic_launch
from kolo._rank_gpu import rank_gpu_index
from kolo.estimator.progress import (
    ProgressReporter,
    rank_result,
    rank_timings,
    resume_position,
    send_progress,
)
from kolo.estimator.spec import checkpoint_bytes, checkpoint_file
from kolo.estimator.torch_spec import TorchSpec

__all__ = ["TorchTrainer", "load_checkpoint", "state_bytes"]

log = logging.getLogger(__name__)


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


def state_bytes(model: Any) -> bytes:
    """``model``'s weights (its ``state_dict``, on the CPU) as ``torch.save`` bytes: what rank 0
    returns; :func:`trained_model` loads them into a copy of the model.

    Example::

        trained = trained_model(model, state_bytes(model))
    """
    return _serialize_checkpoint({k: v.detach().cpu() for k, v in model.state_dict().items()})


def load_checkpoint(store: Any, run_id: str) -> Optional[Dict[str, Any]]:
    """The checkpoint of ``run_id`` in ``store`` (``model``, ``optimizer``, ``epoch`` — the last
    finished epoch, 0-based — ``history``, ``loader``), or ``None`` when there is none.

    Example::

        ckpt = load_checkpoint(store, "run_1")
        print(ckpt["epoch"], ckpt["history"]["train_loss"])
    """
    import torch

    data = checkpoint_bytes(store, run_id)
    if data is None:
        return None
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _device(use_gpu: bool, local_rank: int) -> Any:
    import torch

    if not (use_gpu and torch.cuda.is_available()):
        return torch.device("cpu")
    index = rank_gpu_index(local_rank)
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


class TorchTrainer:
    """The function every rank runs (picklable; see the module docstring).

    ``send(obj)`` delivers rank 0's progress messages to the driver, best effort (default:
    :func:`~kolo.estimator.progress.send_progress`, through the rank's kolo session, which
    every launcher provides); the rank trains on the GPU its launcher assigned
    (:func:`kolo._rank_gpu.rank_gpu_index`) when ``use_gpu``.

    Example::

        trainer = TorchTrainer(spec, send=print)
    """

    def __init__(self, spec: TorchSpec, send: Optional[Callable[[Any], None]] = None) -> None:
        self.spec = spec
        self.send = send or send_progress

    # -- set-up -----------------------------------------------------------------------------

    def _build(self, hvd: Any, torch: Any) -> None:
        spec = self.spec
        if spec.random_seed is not None:
            torch.manual_seed(spec.random_seed)
        self.device = _device(spec.use_gpu, hvd.local_rank())
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
        # Horovod: without loss_weights, every label's loss weighs 1 / number of labels
        self.loss_weights = spec.loss_weights or [1.0 / len(self.losses)] * len(self.losses)
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

    # -- one batch ----------------------------------------------------------------------------

    def _split(self, batch: Dict[str, Any]) -> tuple:
        spec = self.spec
        batch = spec.transform_batch(batch, self.transformation_fn)
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

    def _transform_outputs(self, outputs: Any, labels: List[Any]) -> tuple:
        """Outputs as a list and labels shaped for the loss, as Horovod's ``transform_outputs``:
        without ``label_shapes`` each label takes its output's shape when the element counts
        match (a ``[B]`` label for a ``[B, 1]`` output becomes ``[B, 1]``). A floating label
        with one dimension fewer than its output of several values per row (class indices,
        e.g. from StringIndexer) becomes int64."""
        if not isinstance(outputs, (tuple, list)):
            outputs = [outputs]
        outputs = list(outputs)
        if not self.spec.label_shapes and hasattr(outputs[0], "shape"):
            labels = [
                label.reshape(output.shape) if output.numel() == label.numel() else label
                for output, label in zip(outputs, labels)
            ]
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
            steps = spec.train_steps(loader)
        else:
            steps = spec.val_steps(loader)
        prefix = "train" if train else "val"
        self.model.train(train)
        passes = spec.backward_passes_per_step
        totals = None
        pending = None
        if train:
            self.reporter.epoch_started(epoch, steps)
        grad = contextlib.nullcontext() if train else torch.no_grad()
        with grad:
            for step, batch in enumerate(self._batches(loader, steps)):
                inputs, labels, weights = self._split(batch)
                if train and self.train_minibatch_fn is not None:
                    # Horovod's call: the function zeroes, steps and divides by the passes
                    outputs, loss = self.train_minibatch_fn(
                        self.model,
                        self.optimizer,
                        self._transform_outputs,
                        self._loss,
                        inputs,
                        labels,
                        weights,
                        passes,
                        step,
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
                    self.reporter.step_done(epoch, step + 1, steps)
            if pending is not None:
                reduced = hvd.synchronize(pending)
                totals = reduced if totals is None else totals + reduced
        if train and self.train_minibatch_fn is not None:
            self.optimizer.step()  # Horovod steps once more after a train_minibatch_fn epoch
        means = (totals / max(steps, 1)).tolist() if totals is not None else []
        names = ["loss", *self.metric_names]
        return {f"{prefix}_{n}": float(v) for n, v in zip(names, means)}

    def _checkpoint(self, hvd: Any, epoch: int, history: Dict[str, List[float]]) -> None:
        spec = self.spec
        path = checkpoint_file(spec.store, spec.run_id)
        if hvd.rank() != 0 or path is None:
            return
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": epoch,
            "history": history,
            "loader": self.train_loader.state_dict(),
            "size": hvd.size(),
        }
        spec.store.write_bytes(path, _serialize_checkpoint(state))

    # -- the rank's function ------------------------------------------------------------------

    def __call__(self) -> Optional[Dict[str, Any]]:
        """Trains this rank (see the module docstring); rank 0 returns the weights, history and
        timings, the other ranks ``None``."""
        import torch

        import kolo.torch as hvd

        started, started_unix = time.monotonic(), time.time()
        # When this rank passed each step of its set-up (unix seconds; the fit's launch
        # breakdown, ``getTimings()['launch_phases']``).
        setup = {"imports": started_unix}
        self.spec.prepare_process()
        hvd.init()
        setup["init"] = time.time()
        self._float64 = torch.float64
        self._build(hvd, torch)
        setup["build"] = time.time()
        if elastic_launch():
            return self._train_elastic(hvd, torch, rank_timings(started, started_unix))
        self.train_loader, self.val_loader = self.spec.open_loaders(hvd.rank(), hvd.size())
        setup["loaders"] = time.time()
        self.reporter = ProgressReporter(self.send, hvd.rank(), self.spec.epochs)
        resume = self._resume(hvd)
        start_epoch, history = resume_position(self.train_loader, resume)
        setup["resume"] = time.time()
        timings = rank_timings(started, started_unix)
        writer, local_dir, sync = self._tensorboard(hvd)
        setup["tensorboard"] = time.time()
        timings["setup_unix"] = setup
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
                self.reporter.epoch_done(epoch, logs)
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
        result = rank_result(state_bytes(self.model), history, start_epoch, hvd.size(), timings)
        result["optimizer"] = _serialize_checkpoint(self.optimizer.state_dict())
        return result

    # -- elastic launches ---------------------------------------------------------------------

    def _load_checkpoint(self, hvd: Any) -> Dict[str, Any]:
        """Rank 0 loads the run's checkpoint, if any, without a collective (the elastic loop's
        first sync hands its state to every rank)."""
        ckpt = load_checkpoint(self.spec.store, self.spec.run_id) if hvd.rank() == 0 else None
        if ckpt is None:
            return {"epoch": 0, "history": {}, "loader": None}
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self._scale_lr(self.optimizer, hvd.size())
        log.info(
            "run %s: resuming at epoch %d from its checkpoint", self.spec.run_id, ckpt["epoch"]
        )
        return {
            "epoch": int(ckpt["epoch"]) + 1,
            "history": {k: list(v) for k, v in ckpt["history"].items()},
            "loader": ckpt.get("loader"),
        }

    def _open_loaders(self, hvd: Any, loader_state: Optional[Dict[str, Any]]) -> None:
        """(Re)opens this rank's loaders for the current rank and size: rank r of n reads
        shard r of n, from the committed loader position (the rest of that epoch is spread
        over the current ranks when the size changed)."""
        for loader in (getattr(self, "train_loader", None), getattr(self, "val_loader", None)):
            if loader is not None:
                loader.close()
        self.train_loader, self.val_loader = self.spec.open_loaders(hvd.rank(), hvd.size())
        resume_position(self.train_loader, {"epoch": 0, "loader": loader_state})
        self.reporter = ProgressReporter(self.send, hvd.rank(), self.spec.epochs)

    def _train_elastic(self, hvd: Any, torch: Any, timings: Dict[str, Any]) -> Optional[Dict]:
        """The epochs inside ``hvd.elastic.run`` with a ``TorchState`` committed after every
        epoch: when a rank is lost the others go back to the last commit (the end of the last
        whole epoch), re-open their loaders for the new rank and size, rescale the learning
        rate and train the rest of the epochs, so the run has its full number of epochs."""
        resume = self._load_checkpoint(hvd)
        state = hvd.elastic.TorchState(
            self.model,
            self.optimizer,
            epoch=resume["epoch"],
            start_epoch=resume["epoch"],
            history=resume["history"],
            loader=resume["loader"],
        )
        state.register_reset_callbacks([lambda: self._scale_lr(self.optimizer, hvd.size())])

        @hvd.elastic.run
        def train(state: Any) -> None:
            self._open_loaders(hvd, state.loader)
            while state.epoch < self.spec.epochs:
                epoch = state.epoch
                self._call("on_epoch_begin", epoch, None)
                t0 = time.monotonic()
                if timings["first_step_unix"] is None:
                    timings["first_step_unix"] = time.time()
                logs = self._run_epoch(hvd, torch, epoch, train=True)
                if self.val_loader is not None:
                    logs.update(self._run_epoch(hvd, torch, epoch, train=False))
                history = {k: list(v) for k, v in state.history.items()}
                for key, value in logs.items():
                    history.setdefault(key, []).append(value)
                timings["train_s"] += time.monotonic() - t0
                t1 = time.monotonic()
                self._checkpoint(hvd, epoch, history)
                timings["checkpoint_s"] += time.monotonic() - t1
                self._call("on_epoch_end", epoch, dict(logs))
                self.reporter.epoch_done(epoch, logs)
                state.history = history
                state.loader = self.train_loader.state_dict()
                state.epoch = epoch + 1
                state.commit()

        try:
            train(state)
        finally:
            self.train_loader.close()
            if self.val_loader is not None:
                self.val_loader.close()
        if hvd.rank() != 0:
            return None
        self._scale_lr(self.optimizer, 1.0)
        result = rank_result(
            state_bytes(self.model), state.history, state.start_epoch, hvd.size(), timings
        )
        result["optimizer"] = _serialize_checkpoint(self.optimizer.state_dict())
        return result

    def _tensorboard(self, hvd: Any) -> tuple:
        spec = self.spec
        if hvd.rank() != 0 or spec.store.get_logs_path(spec.run_id) is None:
            return None, None, None
        tensorboard_without_tensorflow()
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


def tensorboard_without_tensorflow() -> None:
    """Makes TensorBoard write its event files with its own TensorFlow stub: with TensorFlow
    installed, ``torch.utils.tensorboard`` imports all of it just to write local files (seconds
    before rank 0's first step, 13 s on a loaded machine against 0.7 s with the stub), and
    TensorFlow beside torch's Triton can abort the process. Left alone when this process
    already has TensorFlow or TensorBoard's choice was made."""
    if "tensorflow" in sys.modules or "tensorboard.compat.notf" in sys.modules:
        return
    # TensorBoard's documented switch (tensorboard/compat: "no_tensorflow"): this module
    # existing forces its stub.
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
