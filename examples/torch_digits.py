"""Data-parallel training of a small classifier with kolo's Horovod-compatible API.

Uses scikit-learn's bundled ``load_digits`` data (no download). Each rank trains on its shard
of the training set; gradients are averaged with ``hvd.allreduce`` after every backward pass,
so all ranks keep identical weights. Rank 0 reports the test accuracy.

Run it with 2 local processes::

    kolorun -np 2 python examples/torch_digits.py
"""

from __future__ import annotations

import hashlib
import socket

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import kolo.torch as hvd

EPOCHS = 30
BATCH_SIZE = 32
LEARNING_RATE = 0.05


def load_shard() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's share of the training data, and the whole test set."""
    digits = load_digits()
    features = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    x_shard = x_train[hvd.rank() :: hvd.size()]
    y_shard = y_train[hvd.rank() :: hvd.size()]
    return (
        torch.from_numpy(x_shard),
        torch.from_numpy(y_shard),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test),
    )


def parameter_checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    hvd.init()
    print(
        f"rank {hvd.rank()} of {hvd.size()}: local_rank {hvd.local_rank()}, "
        f"cross_rank {hvd.cross_rank()}/{hvd.cross_size()}, host {socket.gethostname()}",
        flush=True,
    )
    torch.manual_seed(hvd.rank())  # different on purpose: the broadcast below aligns them
    x_train, y_train, x_test, y_test = load_shard()

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    for index, param in enumerate(model.parameters()):
        hvd.broadcast_(param.data, root_rank=0, name=f"init.{index}")
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE * hvd.size(), momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    # Every rank must take the same number of steps, so use the smallest shard's count.
    local_steps = torch.tensor([len(x_train) // BATCH_SIZE])
    steps = int(hvd.allreduce(local_steps, op=hvd.Min, name="steps").item())
    generator = torch.Generator().manual_seed(1234 + hvd.rank())

    for epoch in range(EPOCHS):
        order = torch.randperm(len(x_train), generator=generator)
        epoch_loss = torch.zeros(1)
        for step in range(steps):
            batch = order[step * BATCH_SIZE : (step + 1) * BATCH_SIZE]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            for index, param in enumerate(model.parameters()):
                param.grad = hvd.allreduce(param.grad, op=hvd.Average, name=f"grad.{index}")
            optimizer.step()
            epoch_loss += loss.detach()
        mean_loss = hvd.allreduce(epoch_loss / steps, name="epoch_loss").item()
        if hvd.rank() == 0 and (epoch % 10 == 9 or epoch == 0):
            print(f"epoch {epoch + 1}/{EPOCHS}: mean training loss {mean_loss:.4f}", flush=True)

    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    checksum = parameter_checksum(model)
    print(f"rank {hvd.rank()}: parameter checksum {checksum}", flush=True)
    checksums = hvd.allgather_object(checksum, name="checksums")
    if hvd.rank() == 0:
        identical = len(set(checksums)) == 1
        print(f"weights identical on all {hvd.size()} ranks: {identical}", flush=True)
        print(f"test accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
