"""A PyTorch classifier trained on a Ray Dataset with ``kolo.ray.TorchEstimator``.

scikit-learn's bundled digits (no download) become a ``ray.data.Dataset`` with a fixed-length
array column ``features`` (64 pixels per row, a Ray tensor column) and an int ``label``.
``TorchEstimator(num_workers=2)`` streams the columns as Arrow into a local store as Parquet
(kolo's Rust writer, no dictionary encoding), trains on 2 ranks that a ``kolo.ray.RayExecutor``
places as Ray actors (the Spark estimator's training loop; gradients averaged by kolo's engine;
a progress bar per epoch), and returns the trained torch model, its history and the run's
checkpoint location. The script evaluates the model on the held-out quarter and prints the
accuracy.

Run it (after ``dev/setup.sh``)::

    .venv/bin/python examples/ray_estimator.py
"""

from __future__ import annotations

import logging
import tempfile
import time

import numpy as np
import pandas as pd
import ray
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from kolo.ray import RayExecutor, TorchEstimator
from kolo.store import Store


def accuracy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output.argmax(dim=1) == label).float().mean()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="ERROR",
        log_to_driver=False,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        (digits.data / 16.0).astype(np.float32),
        digits.target,
        test_size=0.25,
        random_state=0,
        stratify=digits.target,
    )
    # One row per image: a (64,) float32 array (a Ray tensor column) and its label.
    train_ds = ray.data.from_pandas(pd.DataFrame({"features": list(x_train), "label": y_train}))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with tempfile.TemporaryDirectory(prefix="kolo-store-") as store_dir:
        estimator = TorchEstimator(
            num_workers=2,
            # The job's driver service and data plane on loopback.
            settings=RayExecutor.create_settings(timeout_s=60, nics=["lo"]),
            store=Store.create(store_dir),
            model=model,
            # lr for one rank; the ranks use lr * 2, as Horovod scales it.
            optimizer=torch.optim.SGD(model.parameters(), lr=0.025, momentum=0.9),
            loss=torch.nn.functional.cross_entropy,
            metrics=[accuracy],
            feature_cols=["features"],
            label_cols=["label"],
            validation=0.1,
            batch_size=32,
            epochs=15,
            random_seed=0,
        )
        started = time.monotonic()
        result = estimator.fit(train_ds)
        fit_s = time.monotonic() - started
        history = result.history
        print(
            f"fit: {fit_s:.1f} s, {len(history['train_loss'])} epochs, final train loss "
            f"{history['train_loss'][-1]:.4f}, validation accuracy "
            f"{history['val_accuracy'][-1]:.4f}; checkpoint at {result.checkpoint_path}",
            flush=True,
        )

        result.model.eval()
        with torch.no_grad():
            predicted = result.model(torch.from_numpy(x_test)).argmax(dim=1).numpy()
        print(f"test accuracy: {(predicted == y_test).mean():.4f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
