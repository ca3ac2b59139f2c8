"""TorchModel's inference bodies: the Arrow UDF (Spark >= 4.1) and the pandas UDF (Spark 3.5
and 4.0) give the model's outputs for the same rows, and refuse ragged or null features.

The Spark suite runs one of them end to end (the one the installed Spark has); these tests
call both bodies directly on the batches Spark would hand them, so neither can rot."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import nn

pytest.importorskip("pyspark")

from kolo.exceptions import DataError
from kolo.spark.torch.model import TorchPredictor


class _Broadcast:
    """What a Spark broadcast offers the UDF body: the pickled payload as ``value``."""

    def __init__(self, payload: dict) -> None:
        self.value = cloudpickle.dumps(payload)


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(x)


def _lists(rows: np.ndarray) -> pa.Array:
    width = rows.shape[1]
    offsets = pa.array(np.arange(0, len(rows) * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(rows.reshape(-1)))


def _predictor(model: nn.Module, out_cols: list[str], sizes: list, batch: int) -> TorchPredictor:
    payload = {"model": model, "input_shapes": None, "use_gpu": False}
    return TorchPredictor(_Broadcast(payload), out_cols, sizes, batch)


def test_arrow_and_pandas_bodies_give_the_models_outputs() -> None:
    model = TwoHeads().eval()
    x = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    with torch.no_grad():
        want_a, want_b = (t.double().numpy() for t in model(torch.from_numpy(x)))
    # batch 3: the 7 rows run as 3 + 3 + 1
    predictor = _predictor(model, ["a", "b"], [3, None], 3)
    features = _lists(x)

    struct = predictor.arrow_struct(features)
    got_a = np.stack(struct.field("a").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got_a, want_a, rtol=1e-6)
    np.testing.assert_allclose(struct.field("b").to_numpy(), want_b[:, 0], rtol=1e-6)

    frame = predictor.frame(features.to_pandas())
    np.testing.assert_allclose(np.stack(frame["a"].to_numpy()), want_a, rtol=1e-6)
    np.testing.assert_allclose(frame["b"].to_numpy(), want_b[:, 0], rtol=1e-6)

    single = _predictor(nn.Sequential(model.a), ["a"], [3], 1024)
    np.testing.assert_allclose(
        np.stack(single.arrow_array(features).to_numpy(zero_copy_only=False)), want_a, rtol=1e-6
    )
    np.testing.assert_allclose(
        np.stack(single.series(features.to_pandas()).to_numpy()), want_a, rtol=1e-6
    )


def test_a_sliced_batch_reads_its_own_rows() -> None:
    model = nn.Sequential(TwoHeads().a).eval()
    x = np.random.default_rng(1).standard_normal((10, 4)).astype(np.float32)
    features = _lists(x).slice(3, 5)
    with torch.no_grad():
        want = model(torch.from_numpy(x[3:8])).double().numpy()
    predictor = _predictor(model, ["a"], [3], 1024)
    got = np.stack(predictor.arrow_array(features).to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = np.stack(predictor.series(features.to_pandas()).to_numpy())
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_ragged_or_null_features_are_data_errors() -> None:
    predictor = _predictor(nn.Sequential(nn.Linear(2, 1)), ["y"], [None], 1024)
    ragged = pa.array([[1.0, 2.0], [3.0]], type=pa.list_(pa.float32()))
    with pytest.raises(DataError, match="different lengths"):
        predictor.arrow_array(ragged)
    with pytest.raises(DataError, match="different lengths"):
        predictor.series(ragged.to_pandas())
    nulls = pa.array([[1.0, 2.0], None], type=pa.list_(pa.float32()))
    with pytest.raises(DataError, match="nulls"):
        predictor.arrow_array(nulls)
    with pytest.raises(DataError, match="nulls"):
        predictor.series(nulls.to_pandas())
