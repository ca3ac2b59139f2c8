"""Models saved by an earlier kolo still load and predict: a ``TorchModel`` and a ``KerasModel``
written with ``write().save()`` and pickled with ``pickle.dumps`` by kolo at f52c1f0 (before the
estimator core moved out of ``kolo.spark``; ``tests/fixtures/saved_models/make_fixtures.py``
made them), loaded by today's code, give the outputs recorded when they were saved, directly
and through ``transform``."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark

FIXTURES = Path(__file__).parent / "fixtures" / "saved_models"


def _inputs() -> np.ndarray:
    return np.load(FIXTURES / "inputs.npy")


def _expected(name: str) -> np.ndarray:
    return np.load(FIXTURES / f"{name}_expected.npy")


# float32 outputs recorded on another CPU: torch's kernels may round the last bit differently
# (a 3e-8 difference on an output of -0.004 failed rtol=1e-6 alone), so an absolute floor too.
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def _check_params(model, cls_name: str) -> None:
    assert type(model).__name__ == cls_name
    assert model.getFeatureColumns() == ["x"] and model.getLabelColumns() == ["y"]
    assert model.getRunId() == "run_fixture"
    assert model.getOutputCols() == ["y__output"]
    assert model.getMetadata()["columns"]["x"] == {"dtype": "float32", "shape": [4]}


def _torch_outputs(model) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model.getModel()(torch.from_numpy(_inputs())).double().numpy()


def _keras_outputs(model) -> np.ndarray:
    return np.asarray(model.getModel().predict_on_batch(_inputs()), dtype=np.float64)


def _transformed(spark, model) -> np.ndarray:
    rows = [(i, [float(v) for v in row]) for i, row in enumerate(_inputs())]
    df = spark.createDataFrame(rows, "id long, x array<float>")
    out = model.transform(df).orderBy("id").collect()
    return np.array([row["y__output"] for row in out], dtype=np.float64)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    target = tmp_path / "saved_models"
    shutil.copytree(FIXTURES, target)
    return target


def test_a_torch_model_saved_before_loads_and_predicts(spark, saved: Path) -> None:
    from kolo.spark.torch import TorchModel

    model = TorchModel.load(str(saved / "torch_model"))
    _check_params(model, "TorchModel")
    assert model.getHistory() == {"train_loss": [1.0, 0.5]}
    np.testing.assert_allclose(_torch_outputs(model), _expected("torch_model"), **FLOAT32_TOLERANCE)
    np.testing.assert_allclose(
        _transformed(spark, model), _expected("torch_model"), **FLOAT32_TOLERANCE
    )

    unpickled = pickle.loads((saved / "torch_model.pkl").read_bytes())
    _check_params(unpickled, "TorchModel")
    np.testing.assert_allclose(
        _torch_outputs(unpickled), _expected("torch_model"), **FLOAT32_TOLERANCE
    )


def test_a_keras_model_saved_before_loads_and_predicts(spark, saved: Path) -> None:
    from kolo.spark.keras import KerasModel

    model = KerasModel.load(str(saved / "keras_model"))
    _check_params(model, "KerasModel")
    assert model.getHistory() == {"loss": [1.0]}
    np.testing.assert_allclose(_keras_outputs(model), _expected("keras_model"), rtol=1e-5)
    np.testing.assert_allclose(
        _transformed(spark, model), _expected("keras_model"), **FLOAT32_TOLERANCE
    )

    unpickled = pickle.loads((saved / "keras_model.pkl").read_bytes())
    _check_params(unpickled, "KerasModel")
    np.testing.assert_allclose(_keras_outputs(unpickled), _expected("keras_model"), rtol=1e-5)
