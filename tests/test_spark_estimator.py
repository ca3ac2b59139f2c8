"""TorchEstimator → TorchModel on a real local[2] Spark session: fit and transform for
classification, regression and multi-output models, validation by ratio and by column, sample
weights, metrics, persistence, prepared-data reuse, a killed rank with resume from the
checkpoint, and typed errors for bad input."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest
import torch

pytest.importorskip("pyspark")

from support.digits import digit_accuracy, digits_frames

from kolo.exceptions import DataError, InvalidArgumentError, KoloError, StoreError
from kolo.spark.common.util import get_dataset_metadata
from kolo.spark.torch import TorchEstimator, TorchModel
from kolo.spark.torch.remote import load_checkpoint
from kolo.store import Store

# The ranks and Spark's Python workers cannot import this test module: ship its functions and
# classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def accuracy(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output.argmax(dim=1) == label).float().mean()


def mae(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return (output - label).abs().mean()


def mean_output(output: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return output.float().mean()


def classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def classification_estimator(store, **overrides) -> TorchEstimator:
    model = classifier()
    params = dict(
        num_proc=2,
        store=store,
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        loss=torch.nn.functional.cross_entropy,
        metrics=[accuracy],
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.2,
        batch_size=32,
        epochs=4,
        random_seed=1,
        verbose=1,
    )
    params.update(overrides)
    return TorchEstimator(**params)


@pytest.fixture(scope="module")
def digits(spark):
    return digits_frames(spark)


@pytest.fixture(scope="module")
def fitted(spark, digits, tmp_path_factory):
    """One classification fit shared by several tests: (store, estimator, model, seconds)."""
    store = Store.create(str(tmp_path_factory.mktemp("store")))
    est = classification_estimator(store, run_id="digits")
    started = time.monotonic()
    model = est.fit(digits[0])
    return store, est, model, time.monotonic() - started


def test_classification_fit_transform_with_ratio_validation_and_metrics(fitted, digits):
    store, _, model, _ = fitted
    history = model.getHistory()
    assert set(history) == {"train_loss", "train_accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 4 for v in history.values())
    assert history["train_loss"][-1] < history["train_loss"][0] / 3
    assert history["val_accuracy"][-1] > 0.85
    assert model.getRunId() == "digits"
    assert isinstance(model.getModel(), torch.nn.Module)

    predictions = model.transform(digits[1])
    assert predictions.columns == ["features", "label", "label__output"]
    assert dict(predictions.dtypes)["label__output"] == "array<double>"
    assert predictions.count() == digits[1].count()
    assert digit_accuracy(predictions) > 0.88

    # Rank 0's checkpoint of the last epoch and TensorBoard events under the run.
    ckpt = load_checkpoint(store, "digits")
    assert ckpt["epoch"] == 3 and ckpt["history"] == history
    logs = store.list(store.get_logs_path("digits"))
    assert any("tfevents" in path for path in logs), logs


def test_fit_timings_break_the_launch_down(fitted):
    """``getTimings()`` breaks the launch part down: kolo.spark.run's launch report, then rank
    0's set-up steps until its first step; none negative, together within the launch part."""
    from kolo.spark._launch_report import PHASES

    timings = fitted[2].getTimings()
    phases = timings["launch_phases"]
    trainer = ["imports", "init", "build", "loaders", "resume", "tensorboard", "first_step"]
    expected = [name for name, _ in PHASES] + [f"trainer_{s}" for s in trainer]
    # ``warm_fork`` only when a warm rank server forked the ranks (kolo.spark._warm_server).
    assert list(phases) in (expected, [name for name in expected if name != "warm_fork"])
    assert all(seconds >= 0 for seconds in phases.values()), phases
    # From run()'s call to rank 0's first step: within the launch part, which starts earlier.
    assert 0 < sum(phases.values()) <= timings["parts"]["launch"]


def test_regression_with_validation_column_and_sample_weights(spark, tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(800):
        x = rng.uniform(-1, 1, size=2)
        y = 3.0 * x[0] - 2.0 * x[1] + 0.5
        # A quarter of the rows are outliers of weight 0: with the weights applied they are
        # ignored; without them they would pull the fit far off.
        outlier = i % 4 == 0
        rows.append(
            (
                [float(v) for v in x],
                25.0 if outlier else float(y),
                0.0 if outlier else 1.0,
                i % 10 == 0,
            )
        )
    df = spark.createDataFrame(rows, ["x", "y", "weight", "is_val"])
    model = torch.nn.Linear(2, 1)
    est = TorchEstimator(
        num_proc=2,
        store=Store.create(str(tmp_path)),
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
        loss=torch.nn.functional.mse_loss,
        metrics=[mae],
        feature_cols=["x"],
        label_cols=["y"],
        label_shapes=[[-1, 1]],
        sample_weight_col="weight",
        validation="is_val",
        batch_size=16,
        epochs=6,
        verbose=0,
    )
    fitted = est.fit(df)
    history = fitted.getHistory()
    assert len(history["val_loss"]) == 6 and len(history["val_mae"]) == 6
    meta = fitted.getMetadata()
    assert meta["val_rows"] == 80 and meta["train_rows"] == 720

    out = fitted.transform(df.filter(df.weight > 0))
    assert dict(out.dtypes)["y__output"] == "double"
    rows = out.select("y", "y__output").collect()
    error = np.mean([abs(r["y"] - r["y__output"]) for r in rows])
    assert error < 0.3, error


class TwoHeads(torch.nn.Module):
    """A shared body with a classification and a regression head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU())
        self.cls = torch.nn.Linear(32, 3)
        self.reg = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor):
        h = self.body(x)
        return self.cls(h), self.reg(h)


def checked_minibatch(
    model, optimizer, transform_outputs, loss_fn, inputs, labels, weights, passes, batch_idx
):
    """Horovod's default step (``horovod/spark/torch/remote.py``, called with Horovod's nine
    arguments), plus a check that the learning rate was scaled by the ranks."""
    import kolo.torch as hvd

    lr = optimizer.param_groups[0]["lr"]
    if abs(lr - 0.02 * hvd.size()) > 1e-12:
        raise AssertionError(f"lr {lr} is not 0.02 x {hvd.size()} ranks")
    if batch_idx % passes == 0:
        if batch_idx != 0:
            optimizer.step()
        optimizer.zero_grad()
    outputs, labels = transform_outputs(model(*inputs), labels)
    loss = loss_fn(outputs, labels, weights)
    loss.backward()
    return outputs, loss


def test_multi_output_labels(spark, tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(600):
        x = rng.normal(size=4)
        rows.append(([float(v) for v in x], int(np.argmax(x[:3])), float(x.sum())))
    df = spark.createDataFrame(rows, ["x", "kind", "total"])
    model = TwoHeads()
    est = TorchEstimator(
        num_proc=2,
        store=Store.create(str(tmp_path)),
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.02),
        loss=[torch.nn.functional.cross_entropy, torch.nn.functional.mse_loss],
        loss_weights=[1.0, 0.5],
        metrics=[mean_output],
        feature_cols=["x"],
        label_cols=["kind", "total"],
        label_shapes=[[-1], [-1, 1]],
        train_minibatch_fn=checked_minibatch,
        batch_size=16,
        epochs=6,
        verbose=0,
    )
    fitted = est.fit(df)
    history = fitted.getHistory()
    assert {"train_kind_mean_output", "train_total_mean_output"} <= set(history)
    out = fitted.transform(df)
    assert out.columns == ["x", "kind", "total", "kind__output", "total__output"]
    types = dict(out.dtypes)
    assert types["kind__output"] == "array<double>" and types["total__output"] == "double"
    rows = out.collect()
    acc = np.mean([np.argmax(r["kind__output"]) == r["kind"] for r in rows])
    err = np.mean([abs(r["total__output"] - r["total"]) for r in rows])
    assert acc > 0.8 and err < 0.5, (acc, err)

    fitted.setOutputCols(["k", "t"])
    assert fitted.transform(df).columns[-2:] == ["k", "t"]


def test_save_and_load_round_trip_predicts_the_same(fitted, digits):
    store, est, model, _ = fitted
    model_path = f"{store.prefix_path}/saved/model"
    model.write().save(model_path)
    with pytest.raises(StoreError, match="overwrite"):
        model.write().save(model_path)
    model.write().overwrite().save(model_path)
    loaded = TorchModel.load(model_path)
    assert loaded.getHistory() == model.getHistory()
    assert loaded.getRunId() == "digits" and loaded.uid == model.uid
    first = model.transform(digits[1]).select("label__output").collect()
    second = loaded.transform(digits[1]).select("label__output").collect()
    assert [r[0] for r in first] == [r[0] for r in second]

    est_path = f"{store.prefix_path}/saved/estimator"
    est.write().save(est_path)
    again = TorchEstimator.load(est_path)
    assert again.getBatchSize() == 32 and again.getFeatureCols() == ["features"]
    assert again.getValidation() == 0.2 and again.getStore().prefix_path == store.prefix_path
    assert isinstance(again.getModel(), torch.nn.Module)
    assert again.getOptimizer().param_groups[0]["lr"] == 0.05


def test_prepared_data_is_reused_and_fit_on_parquet(fitted, digits):
    store, est, model, _ = fitted
    idx = model.getMetadata()["dataset_idx"]
    again = est.copy().setEpochs(1).setRunId("digits_again").fit(digits[0])
    assert again.getMetadata()["dataset_idx"] == idx
    assert not store.exists(store.get_train_data_path(idx + 1))

    on_parquet = est.copy().setEpochs(1).setRunId("on_parquet").fit_on_parquet(dataset_idx=idx)
    assert len(on_parquet.getHistory()["train_loss"]) == 1
    assert get_dataset_metadata(store, idx).train_rows == model.getMetadata()["train_rows"]


class KillRankOne:
    """Kills the training process of rank 1 in the middle of epoch 2, once (marker file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, step, logs=None):
        import kolo.torch as hvd

        if hvd.rank() == 1 and self.epoch == 2 and step == 3 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def test_killed_rank_fails_fast_and_fit_resumes_from_the_checkpoint(spark, digits, tmp_path):
    store = Store.create(str(tmp_path / "store"))
    marker = str(tmp_path / "killed")
    est = classification_estimator(
        store, run_id="faulty", epochs=4, callbacks=[KillRankOne(marker)], verbose=0
    )
    # Prepare first so the timing covers training only.
    est.copy().setEpochs(0).setRunId("prepare_only").fit(digits[0])
    started = time.monotonic()
    with pytest.raises(KoloError) as info:
        est.fit(digits[0])
    elapsed = time.monotonic() - started
    assert os.path.exists(marker)
    message = str(info.value)
    assert re.search(r"\brank 1\b", message), message
    assert f"host {socket.gethostname()}" in message, message
    assert elapsed < 30, elapsed

    ckpt = load_checkpoint(store, "faulty")
    assert ckpt["epoch"] == 1 and len(ckpt["history"]["train_loss"]) == 2

    resumed = est.fit(digits[0])
    assert resumed._start_epoch == 2
    assert len(resumed.getHistory()["train_loss"]) == 4
    assert resumed.getHistory()["train_loss"][:2] == ckpt["history"]["train_loss"]
    assert load_checkpoint(store, "faulty")["epoch"] == 3


# -- bad input ---------------------------------------------------------------------------------


@pytest.fixture
def small_df(spark):
    return spark.createDataFrame(
        [([float(i), 1.0], float(i % 2), "a") for i in range(64)], ["x", "y", "name"]
    )


def small_estimator(tmp_path, **overrides):
    model = torch.nn.Linear(2, 1)
    params = dict(
        num_proc=2,
        store=Store.create(str(tmp_path)),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss=torch.nn.functional.mse_loss,
        feature_cols=["x"],
        label_cols=["y"],
        batch_size=4,
        verbose=0,
    )
    params.update(overrides)
    return TorchEstimator(**params)


def test_fit_and_transform_take_horovods_df_keyword(fitted, digits, small_df, tmp_path):
    # Horovod: HorovodEstimator.fit(self, df, params=None), HorovodModel.transform(self, df,
    # params=None); PySpark's dataset= keeps working.
    with pytest.raises(DataError, match=r"feature column 'nope'"):
        small_estimator(tmp_path, feature_cols=["nope"]).fit(df=small_df)
    with pytest.raises(DataError, match=r"feature column 'nope'"):
        small_estimator(tmp_path, feature_cols=["nope"]).fit(dataset=small_df)
    with pytest.raises(TypeError, match=r"fit\(\) needs a DataFrame"):
        small_estimator(tmp_path).fit()
    with pytest.raises(InvalidArgumentError, match="twice"):
        small_estimator(tmp_path).fit(df=small_df, dataset=small_df)
    model = fitted[2]
    test = digits[1].limit(20)
    by_df = model.transform(df=test, params={model.output_cols: ["out"]})
    by_dataset = model.transform(dataset=test)
    assert by_df.columns == ["features", "label", "out"]
    assert by_dataset.columns == ["features", "label", "label__output"]
    assert [r.out for r in by_df.collect()] == [r.label__output for r in by_dataset.collect()]


def test_unknown_feature_and_label_columns(small_df, tmp_path):
    with pytest.raises(DataError, match=r"feature column 'nope'.*x, y, name"):
        small_estimator(tmp_path, feature_cols=["nope"]).fit(small_df)
    with pytest.raises(DataError, match=r"label column 'missing'"):
        small_estimator(tmp_path, label_cols=["missing"]).fit(small_df)


def test_string_feature_column(small_df, tmp_path):
    with pytest.raises(DataError, match=r"feature column 'name' has type string.*StringIndexer"):
        small_estimator(tmp_path, feature_cols=["x", "name"]).fit(small_df)


def test_empty_dataframe(small_df, tmp_path):
    with pytest.raises(DataError, match="no rows"):
        small_estimator(tmp_path).fit(small_df.filter("y > 5"))


def test_ragged_vectors(spark, tmp_path):
    df = spark.createDataFrame(
        [([1.0, 2.0] if i % 3 else [1.0], float(i)) for i in range(40)], ["x", "y"]
    )
    with pytest.raises(DataError, match=r"'x'.*different lengths"):
        small_estimator(tmp_path).fit(df)


class LockedModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.lock = threading.Lock()

    def forward(self, x):
        return self.linear(x)


def test_model_or_loss_that_cannot_be_pickled(small_df, tmp_path):
    model = LockedModel()
    with pytest.raises(InvalidArgumentError, match="model cannot be pickled"):
        small_estimator(
            tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
        ).fit(small_df)
    lock = threading.Lock()

    def locked_loss(output, label):
        with lock:
            return torch.nn.functional.mse_loss(output, label)

    with pytest.raises(InvalidArgumentError, match=r"loss cannot be pickled.*loss_constructors"):
        small_estimator(tmp_path, loss=locked_loss).fit(small_df)
    assert not Store.create(str(tmp_path)).exists(str(tmp_path / "intermediate_train_data.0"))


def test_store_path_not_writable(small_df, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="not writable"):
        small_estimator(tmp_path, store=Store.create(str(blocker / "store"))).fit(small_df)


def test_unknown_parameter():
    with pytest.raises(InvalidArgumentError, match=r"no parameter epoch\b"):
        TorchEstimator(epoch=3)


# -- Horovod's label reshaping and loss checks --------------------------------------------------


def test_single_label_regression_reaches_the_noise_floor(spark, tmp_path):
    """One scalar label column, a ``Linear(d, 1)`` output of shape [B, 1], plain ``mse_loss``,
    sample weights and a validation column, no ``label_shapes``: Horovod reshapes each label
    to its output's shape (the element counts match), so the fit reaches the noise floor.
    Handing the loss [B] labels broadcasts them to [B, B] and ends far above it."""
    rng = np.random.default_rng(7)
    sigma, w, b = 0.1, np.array([1.5, -2.0, 0.7, 3.0]), 0.5
    x = rng.normal(size=(1600, 4))
    y = x @ w + b + rng.normal(scale=sigma, size=1600)
    weight = rng.uniform(0.5, 1.5, size=1600)
    rows = [
        ([float(v) for v in xi], float(yi), float(wi), i % 5 == 0)
        for i, (xi, yi, wi) in enumerate(zip(x, y, weight))
    ]
    df = spark.createDataFrame(rows, ["x", "y", "weight", "is_val"])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    est = TorchEstimator(
        num_proc=2,
        store=Store.create(str(tmp_path)),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        loss=torch.nn.functional.mse_loss,
        feature_cols=["x"],
        label_cols=["y"],
        sample_weight_col="weight",
        validation="is_val",
        batch_size=32,
        epochs=4,
        verbose=0,
    )
    fitted = est.fit(df)
    val = fitted.transform(df.filter("is_val")).select("y", "y__output").collect()
    rmse = float(np.sqrt(np.mean([(r["y"] - r["y__output"]) ** 2 for r in val])))
    assert rmse < 1.2 * sigma, rmse
    # the validation loss the ranks measured agrees (weighted MSE, about sigma**2)
    assert fitted.getHistory()["val_loss"][-1] < 2 * sigma**2


def test_loss_without_reduction_and_sample_weights_fails_at_fit_on_the_driver(spark, tmp_path):
    df = spark.createDataFrame(
        [([float(i), 1.0], float(i % 2), 1.0) for i in range(64)], ["x", "y", "weight"]
    )
    sc = spark.sparkContext
    sc.setJobGroup("kolo-reduction-check", "the loss check runs before any Spark job")
    try:
        with pytest.raises(
            InvalidArgumentError, match=r"loss \S*<lambda> cannot take reduction=.*'weight'"
        ):
            small_estimator(
                tmp_path,
                loss=lambda out, y: torch.nn.functional.mse_loss(out, y),
                sample_weight_col="weight",
            ).fit(df)
        assert sc.statusTracker().getJobIdsForGroup("kolo-reduction-check") == []
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert not (tmp_path / "intermediate_train_data.0").exists()
    # a loss module, or a function with reduction=, is fine with sample weights
    for loss in (torch.nn.MSELoss(), lambda out, y, reduction="mean": out.sum()):
        small_estimator(tmp_path, loss=loss, sample_weight_col="weight")._check_params()
