"""kolo.spark.lightning.TorchEstimator → TorchModel on a real local[2] Spark session: fit a
LightningModule on scikit-learn's digits with validation, transform, save/load, resume by
run_id from the store's checkpoint, and typed errors for parameters that do not apply."""

from __future__ import annotations

import sys
from pathlib import Path

import cloudpickle
import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("pyspark")

from support.digits import digit_accuracy, digits_frames

from kolo.exceptions import InvalidArgumentError
from kolo.spark.lightning import TorchEstimator, TorchModel
from kolo.store import Store

# The ranks and Spark's Python workers cannot import this test module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

EPOCHS = 3


class DigitsNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch["features"]), batch["label"])
        self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self(batch["features"])
        self.log("val_loss", F.cross_entropy(out, batch["label"]), sync_dist=True)
        acc = (out.argmax(dim=1) == batch["label"]).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def estimator(store: Store, **overrides: object) -> TorchEstimator:
    params = dict(
        num_proc=2,
        store=store,
        model=DigitsNet(),
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.2,
        batch_size=32,
        epochs=EPOCHS,
        random_seed=1,
        verbose=1,
    )
    params.update(overrides)
    return TorchEstimator(**params)


@pytest.fixture(scope="module")
def digits(spark):
    return digits_frames(spark, vectors=False)


@pytest.fixture(scope="module")
def fitted(digits, tmp_path_factory):
    """One fit shared by several tests: (store, estimator, model)."""
    store = Store.create(str(tmp_path_factory.mktemp("store")))
    est = estimator(store, run_id="lit")
    return store, est, est.fit(digits[0])


def test_fit_records_the_logged_metrics_and_transform_predicts(fitted, digits):
    store, _, model = fitted
    assert isinstance(model, TorchModel)
    history = model.getHistory()
    assert {"train_loss", "val_loss", "val_acc"} <= set(history), history
    assert all(len(history[k]) == EPOCHS for k in ("train_loss", "val_loss", "val_acc"))
    assert history["train_loss"][-1] < history["train_loss"][0]
    assert history["val_acc"][-1] > 0.85, history
    assert isinstance(model.getModel(), DigitsNet)
    assert digit_accuracy(model.transform(digits[1])) > 0.85
    assert store.exists(f"{store.get_checkpoint_path('lit')}/{store.get_checkpoint_filename()}")
    # TensorBoard event logs synced into the run's logs/, and nothing else beside them.
    run = Path(store.prefix_path.removeprefix("file://")) / "runs" / "lit"
    assert list((run / store.get_logs_subdir()).rglob("events.out.tfevents.*")), list(
        run.rglob("*")
    )
    assert not list(run.rglob("*.ckpt")), list(run.rglob("*"))


def test_model_and_estimator_save_and_load(fitted, digits, tmp_path):
    _, est, model = fitted
    path = str(tmp_path / "model")
    model.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    assert loaded.getHistory() == model.getHistory()
    a = model.transform(digits[1]).select("label__output").collect()
    b = loaded.transform(digits[1]).select("label__output").collect()
    assert [r[0] for r in a] == [r[0] for r in b]
    est_path = str(tmp_path / "estimator")
    est.write().overwrite().save(est_path)
    same = TorchEstimator.load(est_path)
    assert (same.getEpochs(), same.getRunId(), same.getLogEveryNSteps()) == (EPOCHS, "lit", 50)
    assert isinstance(same.getModel(), DigitsNet)


def test_fit_with_the_same_run_id_resumes_from_the_checkpoint(fitted, digits):
    store, _, model = fitted
    resumed = estimator(store, run_id="lit", epochs=EPOCHS + 1).fit(digits[0])
    assert resumed._start_epoch == EPOCHS
    history = resumed.getHistory()
    assert len(history["train_loss"]) == EPOCHS + 1
    assert history["train_loss"][:EPOCHS] == model.getHistory()["train_loss"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(optimizer=torch.optim.SGD(DigitsNet().parameters(), lr=0.1)), "configure_optim"),
        (dict(loss=F.cross_entropy), "training_step"),
        (dict(metrics=[lambda o, y: 0.0]), "self.log"),
        (dict(model=torch.nn.Linear(64, 10)), "optimizer is not set"),
        (dict(model=None), "model is not set"),
        (dict(trainer_args={"strategy": "ddp"}), "trainer_args['strategy']"),
        (dict(trainer_args=["max_epochs", 3]), "dict"),
        (dict(num_gpus=2), "num_gpus"),
        (dict(input_shapes=[[-1, 8, 8], [-1, 1]]), "input_shapes"),
    ],
)
def test_bad_parameters_raise_typed_errors_before_any_data_is_written(
    digits, tmp_path, overrides, message
):
    store = Store.create(str(tmp_path / "store"))
    with pytest.raises(InvalidArgumentError) as err:
        estimator(store, **overrides).fit(digits[0])
    assert message in str(err.value)
    assert not (tmp_path / "store" / "intermediate_train_data.0").exists()


def test_a_plain_torch_module_trains_from_optimizer_and_loss_constructors(spark, tmp_path):
    """Horovod's legacy path: a torch.nn.Module (not a LightningModule) with an optimizer and
    losses is wrapped in a LightningModule; loss_constructors, sample weights and each label
    reshaped to its output's shape work as in the PyTorch estimator."""
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 4))
    y = x @ np.array([2.0, -1.0, 0.5, 1.5]) + 0.3
    rows = [
        ([float(v) for v in xi], float(yi), 1.0, i % 5 == 0) for i, (xi, yi) in enumerate(zip(x, y))
    ]
    df = spark.createDataFrame(rows, ["x", "y", "weight", "is_val"])
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    est = TorchEstimator(
        num_proc=2,
        store=Store.create(str(tmp_path)),
        model=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        loss_constructors=[torch.nn.MSELoss],
        feature_cols=["x"],
        label_cols=["y"],
        sample_weight_col="weight",
        validation="is_val",
        batch_size=16,
        epochs=3,
        verbose=0,
    )
    fitted = est.fit(df)
    assert type(fitted.getModel()) is torch.nn.Linear
    assert fitted.getHistory()["val_loss"][-1] < 0.01
    out = fitted.transform(df.filter("is_val")).select("y", "y__output").collect()
    assert max(abs(r["y"] - r["y__output"]) for r in out) < 0.3


def test_unknown_parameters_are_refused():
    with pytest.raises(InvalidArgumentError, match="no parameter trainer_arg"):
        TorchEstimator(trainer_arg={})


@pytest.mark.slow
def test_spark_lightning_example_reaches_90_percent():
    """examples/spark_lightning_estimator.py, in its own Spark session."""
    import os
    import re
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOLO_")}
    result = subprocess.run(
        [sys.executable, "examples/spark_lightning_estimator.py"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    found = re.search(r"test accuracy: ([\d.]+)", result.stdout)
    assert found, result.stdout[-2000:]
    assert float(found.group(1)) >= 0.90, result.stdout
    assert re.search(r"epoch 12/12: 100%.*\d+/\d+", result.stderr)  # the driver's progress bars
