"""Horovod 0.28.1's estimator and model parameters on kolo's classes: every constructor
parameter and accessor Horovod has (its spellings included), the documented
:data:`kolo.estimator.params.NO_EFFECT` rows (each with a reason, each warned once), Horovod's
base-class names, and the model parameters (``_metadata``, ``optimizer``, ``loss``...)."""

from __future__ import annotations

import warnings

import pytest
import torch

from kolo.estimator import params as core_params
from kolo.estimator.params import NO_EFFECT, NoEffectWarning
from kolo.spark.common.estimator import HorovodEstimator, HorovodModel
from kolo.spark.lightning import TorchEstimator as LightningEstimator
from kolo.spark.torch import TorchEstimator, TorchModel

#: Parameters kolo's classes lacked before Horovod's full list was matched (Horovod 0.28.1
#: ``horovod/spark/{torch,lightning}/estimator.py`` constructors).
HOROVOD_TORCH_ONLY = ["data_module", "continuous_cols", "categorical_cols"]
HOROVOD_LIGHTNING_ONLY = [
    "loss_constructors",
    "train_minibatch_fn",
    "transformation_edit_fields",
    "transformation_removed_fields",
    "data_module",
    "loader_num_epochs",
    "debug_data_loader",
    "train_async_data_loader_queue_size",
    "val_async_data_loader_queue_size",
]

#: Horovod's accessors whose spelling is not the parameter's (``EstimatorParams``,
#: ``ModelParams`` and Lightning's ``TorchEstimator``).
HOROVOD_SPELLINGS = [
    "setShufflingBufferSize",
    "getShufflingBufferSize",
    "setTrainReaderNumWorker",
    "getTrainReaderNumWorker",
    "setValReaderNumWorker",
    "getValReaderNumWorker",
    "setInMemoryCacheAll",
    "getInMemoryCacheAll",
    "setTransformationEditFields",
    "setTransformationRemovedFields",
    "setDataModule",
    "setContinuousCols",
    "getCategoricalCols",
]
HOROVOD_LIGHTNING_SPELLINGS = [
    "setNumGPUs",
    "getNumGPUs",
    "setLossConstructors",
    "setTrainMinibatchFn",
    "setLoaderNumEpochs",
    "setDebugDataLoader",
    "setTrainAsyncDataLoaderQueueSize",
    "getValAsyncDataLoaderQueueSize",
]


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which parameters already warned in this process."""
    monkeypatch.setattr(core_params, "_WARNED", set())


def test_every_no_effect_row_has_a_one_line_reason_and_is_a_parameter() -> None:
    assert "NO_EFFECT" in core_params.__all__
    names = {p.name for cls in (TorchEstimator, LightningEstimator) for p in cls().params}
    for name, reason in NO_EFFECT.items():
        assert isinstance(reason, str) and len(reason) > 20 and "\n" not in reason, name
        assert name in names, name


@pytest.mark.parametrize("name", sorted(NO_EFFECT))
def test_every_no_effect_parameter_warns_once(fresh_warnings: None, name: str) -> None:
    cls = LightningEstimator if name == "loader_num_epochs" else TorchEstimator
    value = 3 if name == "loader_num_epochs" else True
    with pytest.warns(NoEffectWarning, match=rf"{name}=.* has no effect in kolo: "):
        cls(**{name: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        cls(**{name: value})  # once per process
        cls().setParams(**{name: value})


def test_a_no_effect_parameter_set_by_its_setter_warns_at_fit(fresh_warnings: None) -> None:
    from kolo.exceptions import InvalidArgumentError

    est = TorchEstimator().setCompressSparseCols(True)
    with pytest.warns(NoEffectWarning, match="compress_sparse_cols=True has no effect"):
        with pytest.raises(InvalidArgumentError, match="feature_cols is not set"):
            est.fit_on_parquet()


def test_parameters_with_an_effect_do_not_warn(fresh_warnings: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        TorchEstimator(
            inmemory_cache_all=True,
            reader_pool_type="dummy",
            mp_start_method="spawn",
            continuous_cols=["x"],
            compress_sparse_cols=False,  # the default: nothing to say
        )


def test_horovod_constructor_parameters_and_accessor_spellings_exist() -> None:
    torch_est = TorchEstimator(**{name: None for name in HOROVOD_TORCH_ONLY})
    lightning_est = LightningEstimator(**{name: None for name in HOROVOD_LIGHTNING_ONLY})
    for name in HOROVOD_SPELLINGS:
        assert callable(getattr(torch_est, name)), name
        assert callable(getattr(lightning_est, name)), name
    for name in HOROVOD_LIGHTNING_SPELLINGS:
        assert callable(getattr(lightning_est, name)), name
    torch_est.setShufflingBufferSize(512).setTrainReaderNumWorker(3).setInMemoryCacheAll(True)
    assert torch_est.getShuffleBufferSize() == 512 == torch_est.getShufflingBufferSize()
    assert torch_est.getTrainReaderNumWorkers() == 3 and torch_est.getInMemoryCacheAll()
    assert lightning_est.setNumGPUs(0).getNumGpus() == 0
    # Horovod's defaults
    assert torch_est.getReaderPoolType() == "thread" and torch_est.getDebugDataLoader() is False


def test_horovod_base_class_names() -> None:
    assert isinstance(TorchEstimator(), HorovodEstimator)
    assert isinstance(LightningEstimator(), HorovodEstimator)
    assert isinstance(TorchModel(), HorovodModel)


def test_torch_model_takes_horovods_model_parameters() -> None:
    net = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.9)
    net(torch.ones(2, 3)).sum().backward()
    optimizer.step()  # momentum buffers: state to carry over
    meta = {"columns": {"x": {"dtype": "float32", "shape": [3]}}}
    model = TorchModel(
        history={"train_loss": [1.0]},
        model=net,
        feature_columns=["x"],
        input_shapes=None,
        label_columns=["y"],
        optimizer=optimizer,
        run_id="run_1",
        _metadata=meta,
        loss=torch.nn.functional.mse_loss,
        loss_constructors=None,
    )
    assert model.getMetadata() == meta == model._get_metadata()
    assert model.getOrDefault(model._metadata) == meta
    assert model.getLoss() is torch.nn.functional.mse_loss
    rebuilt = model.getOptimizer()  # Horovod: rebuilt on the model's parameters
    assert type(rebuilt) is torch.optim.SGD and rebuilt is not optimizer
    assert rebuilt.param_groups[0]["params"] == list(net.parameters())
    assert rebuilt.param_groups[0]["lr"] == 0.3
    assert rebuilt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    model.setLabelColoumns(["z"])  # Horovod's spelling
    assert model.getLabelColumns() == ["z"]
    model.setParams(_metadata={"columns": {}})
    assert model.getMetadata() == {"columns": {}}


@pytest.mark.parametrize("cls", [TorchEstimator, LightningEstimator])
def test_horovods_constructor_checks_are_value_errors(cls) -> None:
    with pytest.raises(ValueError, match="only one of loss_constructors and loss"):
        cls(loss=torch.nn.functional.mse_loss, loss_constructors=[torch.nn.MSELoss])
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        cls(backward_passes_per_step=0)
