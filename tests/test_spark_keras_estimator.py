"""KerasEstimator → KerasModel on a real local[2] Spark session: fit and transform of a Keras 3
classifier (with a custom layer, the best-epoch checkpoint callback and validation), persistence,
resume by run_id, the torch backend in the ranks, and typed errors for bad parameters."""

from __future__ import annotations

import sys
import threading

import cloudpickle
import numpy as np
import pytest
import torch

# isort: split
# Before Keras: kolo.keras loads triton ahead of TensorFlow (see docs/keras.md), so torch.optim
# works in this process after TensorFlow is loaded.
import kolo.keras as hvd

# isort: split
import keras

pytest.importorskip("pyspark")

from support.digits import digit_accuracy, digits_frames

from kolo.exceptions import InvalidArgumentError, StoreError
from kolo.spark.keras import KerasEstimator, KerasModel
from kolo.spark.keras.remote import load_checkpoint
from kolo.store import Store

# The ranks and Spark's Python workers cannot import this test module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


class Scale(keras.layers.Layer):
    """A custom layer (needs custom_objects to load): multiplies by a trainable scalar."""

    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones", name="factor")

    def call(self, x):
        return x * self.factor


def classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            Scale(),
            keras.layers.Dense(10),
        ]
    )


def estimator(store, **overrides) -> KerasEstimator:
    params = dict(
        num_proc=2,
        store=store,
        model=classifier(),
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        custom_objects={"Scale": Scale},
        feature_cols=["features"],
        label_cols=["label"],
        validation=0.2,
        batch_size=32,
        epochs=4,
        random_seed=0,
        verbose=0,
    )
    params.update(overrides)
    return KerasEstimator(**params)


@pytest.fixture(scope="module")
def digits(spark):
    return digits_frames(spark)


@pytest.fixture(scope="module")
def fitted(digits, tmp_path_factory):
    """One fit shared by several tests: (store, estimator, model)."""
    store = Store.create(str(tmp_path_factory.mktemp("store")))
    est = estimator(
        store,
        run_id="digits",
        checkpoint_callback=hvd.callbacks.BestModelCheckpoint(monitor="val_loss"),
    )
    return store, est, est.fit(digits[0])


def test_fit_transform_with_validation_metrics_and_best_checkpoint(fitted, digits):
    store, _, model = fitted
    history = model.getHistory()
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 4 for v in history.values())
    assert history["loss"][-1] < history["loss"][0] / 3
    assert history["val_accuracy"][-1] > 0.85
    assert model.getRunId() == "digits"
    assert isinstance(model.getModel(), keras.Model)
    assert isinstance(model.getModel().layers[1], Scale)

    predictions = model.transform(digits[1])
    assert predictions.columns == ["features", "label", "label__output"]
    assert dict(predictions.dtypes)["label__output"] == "array<double>"
    assert predictions.count() == digits[1].count()
    assert digit_accuracy(predictions) > 0.88

    # Rank 0's checkpoint of the last epoch, holding the best epoch's model too.
    ckpt = load_checkpoint(store, "digits")
    assert ckpt["epoch"] == 3 and ckpt["history"] == history
    assert ckpt["best"] is not None


def test_save_and_load_round_trip_predicts_the_same(fitted, digits):
    store, est, model = fitted
    model_path = f"{store.prefix_path}/saved/model"
    model.write().save(model_path)
    with pytest.raises(StoreError, match="overwrite"):
        model.write().save(model_path)
    model.write().overwrite().save(model_path)
    loaded = KerasModel.load(model_path)
    assert loaded.getHistory() == model.getHistory()
    assert loaded.getRunId() == "digits" and loaded.uid == model.uid
    assert isinstance(loaded.getModel().layers[1], Scale)
    first = model.transform(digits[1]).select("label__output").collect()
    second = loaded.transform(digits[1]).select("label__output").collect()
    assert np.allclose([r[0] for r in first], [r[0] for r in second], atol=1e-6)

    est_path = f"{store.prefix_path}/saved/estimator"
    est.write().save(est_path)
    again = KerasEstimator.load(est_path)
    assert again.getBatchSize() == 32 and again.getFeatureCols() == ["features"]
    assert isinstance(again.getModel(), keras.Model)
    assert isinstance(again.getModel().layers[1], again.getCustomObjects()["Scale"])
    assert again.getOptimizer().get_config()["momentum"] == 0.9


def test_resume_by_run_id_continues_from_the_checkpoint(fitted, digits):
    store, est, _ = fitted
    first = est.copy().setEpochs(2).setRunId("resumed").setCheckpointCallback(None)
    first_model = first.fit(digits[0])
    ckpt = load_checkpoint(store, "resumed")
    assert ckpt["epoch"] == 1 and len(ckpt["history"]["loss"]) == 2

    resumed = first.copy().setEpochs(3).fit(digits[0])
    assert resumed._start_epoch == 2
    history = resumed.getHistory()
    assert len(history["loss"]) == 3
    assert history["loss"][:2] == first_model.getHistory()["loss"]
    assert history["loss"][2] < history["loss"][0]
    assert load_checkpoint(store, "resumed")["epoch"] == 2


def test_ranks_train_with_the_torch_backend_through_backend_env(digits, tmp_path):
    est = estimator(
        Store.create(str(tmp_path)),
        backend_env={"KERAS_BACKEND": "torch"},
        epochs=2,
        validation=None,
    )
    model = est.fit(digits[0])
    assert len(model.getHistory()["loss"]) == 2
    assert model.getHistory()["accuracy"][-1] > 0.8


# -- bad input ---------------------------------------------------------------------------------


@pytest.fixture
def small_df(spark):
    return spark.createDataFrame([([float(i), 1.0], float(i % 2)) for i in range(64)], ["x", "y"])


def small_estimator(tmp_path, **overrides) -> KerasEstimator:
    params = dict(
        num_proc=2,
        store=Store.create(str(tmp_path)),
        model=keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
        optimizer=keras.optimizers.SGD(0.1),
        loss="mse",
        feature_cols=["x"],
        label_cols=["y"],
        batch_size=4,
        verbose=0,
    )
    params.update(overrides)
    return KerasEstimator(**params)


class Locked(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model": None}, "model is not set"),
        ({"model": torch.nn.Linear(2, 1)}, "keras.Model, got Linear.*TorchEstimator"),
        (
            {"optimizer": torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)},
            "keras.optimizers.Optimizer, got SGD",
        ),
        ({"optimizer": None}, "optimizer is not set"),
        (
            {"optimizer": hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))},
            "already a kolo.keras.DistributedOptimizer",
        ),
        ({"loss": None}, "loss is not set"),
        ({"loss": ["mse", "mae"]}, "2 losses for 1 label columns"),
        ({"label_shapes": [[-1, 1], [-1, 1]]}, "label_shapes has 2 shapes"),
        ({"checkpoint_callback": keras.callbacks.History()}, "checkpoint_callback must be"),
        ({"backend_env": "torch"}, "backend_env must be a dict"),
        ({"gradient_compression": "fp16"}, "kolo.keras.Compression"),
        ({"callbacks": [Locked()]}, "cannot be pickled"),
    ],
)
def test_bad_parameters_raise_before_any_data_is_written(small_df, tmp_path, overrides, message):
    with pytest.raises(InvalidArgumentError, match=message):
        small_estimator(tmp_path, **overrides).fit(small_df)
    assert not Store.create(str(tmp_path)).exists(str(tmp_path / "intermediate_train_data.0"))


def test_unknown_and_torch_only_parameters():
    with pytest.raises(InvalidArgumentError, match=r"no parameter epoch\b"):
        KerasEstimator(epoch=3)
    with pytest.raises(InvalidArgumentError, match=r"no parameter input_shapes"):
        KerasEstimator(input_shapes=[[-1, 2]])
