"""Trains a LightningModule with ``Trainer(strategy="kolo")`` and checks it against one process.

Run under ``kolorun -np 2`` with ``OUT_DIR`` (a shared scratch folder) and scenario names as
arguments. Every rank also computes the single-process reference itself (same seed, plain
PyTorch on the doubled batch), compares, and prints ``rank R: <scenario> ok (...)``; any
difference raises and the rank exits non-zero.

Scenarios:
- ``equal``: 2 ranks x 8 rows per step (a DataLoader without sampler: Lightning injects a
  shuffling DistributedSampler) == one process on the 16 rows both ranks had, SGD with
  momentum, 2 epochs, float64.
- ``single``: the same run launched bare (``python lightning_worker.py``), one rank.
- ``accumulate``: 2 ranks x 4 rows x ``accumulate_grad_batches=2`` == one process x 16 rows.
- ``syncbn``: ``sync_batchnorm=True`` == one process with BatchNorm1d on the doubled batch.
- ``fabric``: ``Fabric(strategy="kolo")`` == one process on the doubled batch.
- ``refit``: a second ``fit`` of the same module with a new Trainer trains correctly.
- ``sync_dist``: a validation metric logged with ``sync_dist=True`` equals the mean over all
  validation rows; ``reduce``/``all_gather``/``broadcast``/``barrier`` of the strategy.
- ``checkpoint``: ``ModelCheckpoint`` every epoch; every rank records the checkpoint writes its
  ``CheckpointIO`` made into ``OUT_DIR/writes.rank<R>`` (the test checks that only rank 0
  wrote) and the saved weights equal the trained ones.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import kolo.lightning  # noqa: F401 - registers strategy="kolo"
import kolo.torch as hvd
from kolo.exceptions import InvalidArgumentError
from kolo.lightning import KoloStrategy

ROWS = 64
LR = 0.1
MOMENTUM = 0.9
EPOCHS = 2
torch.set_default_dtype(torch.float64)
warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        _, y = batch
        self.log("val_y_mean", y.mean(), sync_dist=True, batch_size=len(y))
        self.log("val_rows", float(len(y)), sync_dist=True, reduce_fx="sum", batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


def data(rows: int = ROWS, seed: int = 1234) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(rows, 4, generator=g), torch.randn(rows, 3, generator=g))


def epoch_batches(epoch: int, rank_batch: int, ranks: int, shuffle: bool = True) -> list:
    """The row indices of each step of ``epoch`` over ``ranks`` ranks: the order Lightning's
    injected ``DistributedSampler`` (seed 0, ``set_epoch``) gives each rank, joined."""
    order = list(range(ROWS))
    if shuffle:
        order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(epoch)).tolist()
    per_rank = [order[r::ranks] for r in range(ranks)]
    steps = len(per_rank[0]) // rank_batch
    return [
        [i for r in range(ranks) for i in per_rank[r][k * rank_batch : (k + 1) * rank_batch]]
        for k in range(steps)
    ]


def reference(rank_batch: int, ranks: int, shuffle: bool = True) -> dict:
    """Plain PyTorch, one process: each step on the rows all ``ranks`` ranks had together."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = data().tensors
    for epoch in range(EPOCHS):
        for rows in epoch_batches(epoch, rank_batch, ranks, shuffle):
            opt.zero_grad()
            F.mse_loss(model(x[rows]), y[rows]).backward()
            opt.step()
    return model.state_dict()


def check_refit() -> str:
    """Two fits of one module with two Trainers (the first fit's gradient hooks must be gone):
    equals two 1-epoch runs with a fresh optimizer each, on the doubled batch."""
    model = Net()
    for _ in range(2):
        trainer(max_epochs=1).fit(model, DataLoader(data(), batch_size=8, shuffle=False))
    expected = Net()
    x, y = data().tensors
    for _ in range(2):
        opt = torch.optim.SGD(expected.parameters(), lr=LR, momentum=MOMENTUM)
        for rows in epoch_batches(0, 8, hvd.size()):
            opt.zero_grad()
            F.mse_loss(expected(x[rows]), y[rows]).backward()
            opt.step()
    diff = max_diff(model.state_dict(), expected.state_dict())
    assert diff < 1e-9, f"the second fit differs by {diff}"
    return f"max diff {diff:.2e}"


def check_fabric() -> str:
    """``Fabric(strategy="kolo")``: 2 ranks x 2 micro-batches of 4 rows (``no_backward_sync``
    on the first; a sequential DataLoader, so the injected DistributedSampler does not
    shuffle) == one process on the 16 rows."""
    from lightning.fabric import Fabric

    from kolo.lightning import KoloFabricStrategy

    fabric = Fabric(strategy="kolo", accelerator="cpu", devices=1, precision="64-true")
    assert isinstance(fabric.strategy, KoloFabricStrategy), type(fabric.strategy)
    assert (fabric.world_size, fabric.global_rank) == (hvd.size(), hvd.rank())
    fabric.launch()
    model = Net()
    if hvd.rank() == 1:
        with torch.no_grad():
            model.fc1.weight.add_(1.0)  # fabric.setup must broadcast rank 0's weights
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM))
    micro = 2  # batches of 4 rows, 2 per step: the first backward under no_backward_sync
    loader = fabric.setup_dataloaders(DataLoader(data(), batch_size=8 // micro, shuffle=False))
    assert type(loader.sampler).__name__ == "DistributedSampler", type(loader.sampler)
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i % micro == 0:
                opt.zero_grad()
            last = i % micro == micro - 1
            with fabric.no_backward_sync(model, enabled=not last):
                fabric.backward(F.mse_loss(model(x), y) / micro)
            if last:
                opt.step()
    expected = reference(8, hvd.size(), shuffle=False)
    diff = max_diff(model.module.state_dict(), expected)
    assert diff < 1e-9, f"2-rank Fabric training differs from one process by {diff}"
    mean = fabric.all_reduce(torch.tensor(float(hvd.rank())))
    assert float(mean) == (hvd.size() - 1) / 2, mean
    assert fabric.broadcast(hvd.rank(), src=0) == 0
    return f"max diff {diff:.2e}"


class BNNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def check_syncbn() -> str:
    """``sync_batchnorm=True``: batch norm statistics over both ranks' rows, so 2 ranks x 8
    rows == one process with a plain BatchNorm1d on the 16 rows (weights and running stats)."""
    from kolo.torch import SyncBatchNorm

    seen = []

    class Spy(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            seen.append(type(module.bn))

    model = BNNet()
    trainer(sync_batchnorm=True, callbacks=[Spy()]).fit(
        model, DataLoader(data(), batch_size=8, shuffle=False)
    )
    assert seen == [SyncBatchNorm], seen
    assert not isinstance(model.bn, SyncBatchNorm), type(model.bn)  # reverted at teardown
    expected = BNNet()
    opt = torch.optim.SGD(expected.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = data().tensors
    for epoch in range(EPOCHS):
        for rows in epoch_batches(epoch, 8, hvd.size()):
            opt.zero_grad()
            F.mse_loss(expected(x[rows]), y[rows]).backward()
            opt.step()
    diff = max_diff(model.state_dict(), expected.state_dict())
    assert diff < 1e-9, f"sync_batchnorm training differs from one process by {diff}"
    return f"max diff {diff:.2e}"


def trainer(**kwargs: object) -> pl.Trainer:
    args = dict(
        strategy="kolo",
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    args.update(kwargs)
    return pl.Trainer(**args)


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def check_equal(batch: int, accumulate: int) -> str:
    model = Net()
    t = trainer(accumulate_grad_batches=accumulate)
    assert isinstance(t.strategy, KoloStrategy), type(t.strategy)
    assert t.world_size == hvd.size() and t.global_rank == hvd.rank()
    t.fit(model, DataLoader(data(), batch_size=batch, shuffle=False))
    sampler = t.train_dataloader.sampler
    assert type(sampler).__name__ == "DistributedSampler", type(sampler)
    assert (sampler.num_replicas, sampler.rank) == (hvd.size(), hvd.rank())
    expected = reference(batch * accumulate, hvd.size())
    diff = max_diff(model.state_dict(), expected)
    assert diff < 1e-9, f"2-rank training differs from one process by {diff}"
    if hvd.size() == 1:
        return f"max diff {diff:.2e}"
    # Local-only training (one rank's rows) must be far off, or this check proves nothing.
    far = max_diff(reference(batch * accumulate, 1), expected)
    assert far > 1e-3, far
    # Ranks hold the same weights.
    gathered = hvd.allgather(model.fc1.weight.detach().unsqueeze(0))
    assert torch.equal(gathered[0], gathered[1])
    return f"max diff {diff:.2e}, local-only {far:.2e}"


def check_sync_dist() -> str:
    model = Net()
    t = trainer(max_epochs=1)
    val = data(rows=32, seed=99)
    t.fit(
        model,
        DataLoader(data(), batch_size=8, shuffle=False),
        DataLoader(val, batch_size=4, shuffle=False),
    )
    logged = float(t.callback_metrics["val_y_mean"])
    expected = float(val.tensors[1].mean())
    assert abs(logged - expected) < 1e-9, (logged, expected)
    # This rank's own rows give another mean: the sync is what made them equal.
    mine = val.tensors[1][hvd.rank() :: 2].mean()
    assert abs(float(mine) - expected) > 1e-4
    assert float(t.callback_metrics["val_rows"]) == 32.0, t.callback_metrics["val_rows"]
    s = t.strategy
    rank = hvd.rank()
    assert float(s.reduce(torch.tensor(float(rank + 1)))) == 1.5
    assert float(s.reduce(torch.tensor(rank + 1), reduce_op="sum")) == 3
    assert float(s.reduce(torch.tensor(float(rank)), reduce_op="max")) == 1.0
    assert float(s.reduce(torch.tensor(rank + 1), reduce_op="mean")) == 1.5
    assert s.reduce_boolean_decision(rank == 0, all=False) is True
    assert s.reduce_boolean_decision(rank == 0, all=True) is False
    assert s.all_gather(torch.tensor([rank, 10 + rank])).tolist() == [[0, 10], [1, 11]]
    assert s.all_gather(torch.tensor(float(rank))).tolist() == [0.0, 1.0]
    assert s.broadcast({"from": rank}, src=1) == {"from": 1}
    s.barrier("test")
    for bad in (dict(reduce_op="median"), dict(group=object())):
        try:
            s.reduce(torch.tensor(1.0), **bad)
        except InvalidArgumentError as err:
            assert "reduce" in str(err), err
        else:
            raise AssertionError(f"reduce({bad}) did not raise")
    return f"val_y_mean {logged:.6f} == {expected:.6f}"


class RecordingIO(TorchCheckpointIO):
    """Records every checkpoint write of this rank in ``OUT_DIR/writes.rank<R>``."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def save_checkpoint(
        self, checkpoint: dict, path: object, storage_options: object = None
    ) -> None:
        with open(self.out / f"writes.rank{hvd.rank()}", "a") as f:
            f.write(json.dumps(str(path)) + "\n")
        super().save_checkpoint(checkpoint, path, storage_options)


def check_checkpoint(out: Path) -> str:
    model = Net()
    ckpt_dir = out / "checkpoints"
    t = trainer(
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_top_k=-1, every_n_epochs=1)],
        plugins=[RecordingIO(out)],
    )
    t.fit(model, DataLoader(data(), batch_size=8, shuffle=False))
    t.strategy.barrier()
    files = sorted(p.name for p in ckpt_dir.iterdir())
    assert len(files) == EPOCHS, files
    saved = torch.load(ckpt_dir / files[-1], weights_only=False)["state_dict"]
    diff = max_diff(saved, copy.deepcopy(model.state_dict()))
    assert diff == 0.0, diff
    return f"checkpoints {files}"


def main() -> None:
    out = Path(sys.argv[1])
    hvd.init()
    rank = hvd.rank()
    for scenario in sys.argv[2:]:
        if scenario in ("equal", "single"):
            detail = check_equal(batch=8, accumulate=1)
        elif scenario == "accumulate":
            detail = check_equal(batch=4, accumulate=2)
        elif scenario == "syncbn":
            detail = check_syncbn()
        elif scenario == "fabric":
            detail = check_fabric()
        elif scenario == "refit":
            detail = check_refit()
        elif scenario == "sync_dist":
            detail = check_sync_dist()
        elif scenario == "checkpoint":
            detail = check_checkpoint(out)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        print(f"rank {rank}: {scenario} ok ({detail})", flush=True)
    os.makedirs(out, exist_ok=True)


if __name__ == "__main__":
    main()
