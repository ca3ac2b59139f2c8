"""Horovod's small estimator/model helpers: ``get_model_class``, ``get_model_shapes``,
``get_prediction_fn`` and ``get_version_mismatch_message``."""

import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyspark")


def test_get_model_class_names_the_transformer_fit_returns() -> None:
    from kolo.spark.keras import KerasEstimator, KerasModel
    from kolo.spark.lightning import TorchEstimator as LightningEstimator
    from kolo.spark.torch import TorchEstimator, TorchModel

    assert TorchEstimator().get_model_class() is TorchModel
    assert LightningEstimator().get_model_class() is TorchModel
    assert KerasEstimator().get_model_class() is KerasModel


def test_keras_get_model_shapes_gives_minus_one_for_unknown_dimensions() -> None:
    import keras

    from kolo.spark.keras import KerasEstimator

    inputs = keras.Input(shape=(8,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    assert KerasEstimator(model=model).get_model_shapes() == ([[-1, 8]], [[-1, 3]])


def test_prediction_fn_reshapes_each_feature_column_to_its_input_shape() -> None:
    from kolo.spark.torch import TorchModel

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 1))
    model = TorchModel(model=net, feature_columns=["x"], input_shapes=[[-1, 2, 2]])
    predict = model.get_prediction_fn()
    row = {"x": [1.0, 2.0, 3.0, 4.0]}
    expected = net(torch.tensor([row["x"]]).reshape(-1, 2, 2))
    assert torch.equal(predict(net, row), expected.detach())


def test_version_mismatch_message_and_error_are_horovods() -> None:
    from kolo.common.exceptions import HorovodVersionMismatchError, get_version_mismatch_message

    text = get_version_mismatch_message("torch", "2.5.0", "2.4.0")
    assert text.startswith("Framework torch installed with version 2.4.0 but found version 2.5.0.")
    err = pickle.loads(pickle.dumps(HorovodVersionMismatchError("torch", "2.5.0", "2.4.0")))
    assert isinstance(err, ImportError) and str(err) == text
