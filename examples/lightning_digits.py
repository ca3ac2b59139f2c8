"""Data-parallel PyTorch Lightning training with kolo: ``Trainer(strategy="kolo")``.

Uses scikit-learn's bundled ``load_digits`` data (no download). Lightning gives each rank its
share of the training set (a ``DistributedSampler`` injected by the strategy); kolo averages
the gradients while backward runs, logs ``sync_dist`` metrics averaged over the ranks, and only
rank 0 writes the checkpoint. Rank 0 reports the test accuracy.

Run it with 2 local processes::

    kolorun -np 2 python examples/lightning_digits.py
"""

from __future__ import annotations

import hashlib
import tempfile
import warnings

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import kolo.lightning  # noqa: F401 - registers strategy="kolo"
import kolo.torch as hvd

EPOCHS = 15
BATCH_SIZE = 32  # per rank
warnings.filterwarnings("ignore", ".*does not have many workers.*")


class DigitsClassifier(pl.LightningModule):
    def __init__(self, learning_rate: float = 0.05) -> None:
        super().__init__()
        self.learning_rate = learning_rate
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.learning_rate, momentum=0.9)


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    return (
        TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
        TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test)),
    )


def parameter_checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    hvd.init()
    torch.manual_seed(hvd.rank())  # different on purpose: the strategy broadcasts rank 0's
    train, test = datasets()
    model = DigitsClassifier()
    checkpoint_dir = hvd.broadcast_object(
        tempfile.mkdtemp(prefix="kolo-lightning-") if hvd.rank() == 0 else None
    )
    trainer = pl.Trainer(
        strategy="kolo",
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=checkpoint_dir, monitor="val_acc", mode="max")],
    )
    trainer.fit(
        model,
        DataLoader(train, batch_size=BATCH_SIZE, shuffle=True),
        DataLoader(test, batch_size=128),
    )
    metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
    print(f"rank {hvd.rank()}: parameter checksum {parameter_checksum(model)}", flush=True)
    if hvd.rank() == 0:
        print(f"metrics (averaged over {hvd.size()} ranks): {metrics}", flush=True)
        print(f"test accuracy: {metrics['val_acc']:.4f}", flush=True)
        print(f"best checkpoint: {trainer.checkpoint_callback.best_model_path}", flush=True)


if __name__ == "__main__":
    main()
