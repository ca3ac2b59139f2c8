"""Pieces of bench/spark_estimator.py's peers: the model both trainers fit, and two
hand-written ways to run inference on a DataFrame (Horovod's row-by-row ``mapPartitions`` and
a batched ``mapInPandas``). The TorchDistributor training function lives in the script itself:
TorchDistributor pickles it again inside the Spark task, where only ``__main__`` functions
travel by value."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn


def make_model(features: int, classes: int) -> nn.Module:
    """The model both trainers fit: a two-layer MLP."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, classes))


def row_by_row(model: nn.Module, feature_col: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Horovod's transform: ``mapPartitions`` predicting one row at a time."""

    def predict(rows: Iterator[Any]) -> Iterator[Any]:
        from pyspark.sql import Row

        torch.set_num_threads(1)
        model.eval()
        with torch.no_grad():
            for row in rows:
                x = torch.tensor(np.asarray(row[feature_col], dtype=np.float32)).unsqueeze(0)
                output = model(x)[0].tolist()
                yield Row(**row.asDict(), prediction=output)

    return predict


def batched_pandas(model: nn.Module, feature_col: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A hand-written batched ``mapInPandas`` inference."""

    def predict(frames: Iterator[Any]) -> Iterator[Any]:
        torch.set_num_threads(1)
        model.eval()
        with torch.no_grad():
            for frame in frames:
                x = torch.from_numpy(np.stack(frame[feature_col].to_numpy()).astype(np.float32))
                out = model(x).numpy().astype(np.float64)
                frame["prediction"] = list(out)
                yield frame

    return predict
