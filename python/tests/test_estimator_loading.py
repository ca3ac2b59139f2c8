"""Horovod's loader parameters in the estimators' torch rank loop, run as one rank in this
process on data prepared into a local store: ``data_module`` (with ``continuous_cols``/
``categorical_cols``), ``inmemory_cache_all``, ``transformation_edit_fields``/
``transformation_removed_fields``, ``reader_pool_type``, the async queue sizes,
``debug_data_loader``, ``mp_start_method`` and Horovod's ``train_minibatch_fn`` call."""

from __future__ import annotations

import logging
import multiprocessing
from typing import ClassVar, List

import numpy as np
import pandas as pd
import pytest
import torch

import kolo.torch as hvd
from kolo.data import prepare_data
from kolo.estimator.dataset import get_dataset_metadata
from kolo.estimator.params import training_defaults
from kolo.estimator.torch_spec import build_torch_spec
from kolo.estimator.torch_trainer import TorchTrainer
from kolo.exceptions import InvalidArgumentError
from kolo.store import Store

ROWS, VAL_ROWS = 96, 32


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS + VAL_ROWS, 3)).astype("float32")
    df = pd.DataFrame(
        {
            "x": list(x),
            "y": x @ np.array([1.0, -2.0, 0.5]),
            "is_val": np.arange(ROWS + VAL_ROWS) < VAL_ROWS,
        }
    )
    store = Store.create(str(tmp_path_factory.mktemp("store")))
    data = prepare_data(store, df, feature_columns="x", label_columns="y", validation="is_val")
    return store, get_dataset_metadata(store, data.dataset_idx, ["x", "y"])


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    hvd.init()
    yield
    hvd.shutdown()


def train(prepared, run_id: str, **overrides):
    """Runs the rank loop once; returns rank 0's result."""
    store, meta = prepared
    model = torch.nn.Linear(3, 1)
    values = {
        **training_defaults(),
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.05),
        "loss": torch.nn.functional.mse_loss,
        "feature_cols": ["x"],
        "label_cols": ["y"],
        "batch_size": 16,
        "epochs": 3,
        "verbose": 0,
        "use_gpu": False,
        **overrides,
    }
    spec = build_torch_spec(values.__getitem__, store, run_id, meta)
    return TorchTrainer(spec, send=lambda message: None)()


def add_scratch(batch):
    """A transformation_fn adding a field (removed again by transformation_removed_fields)."""
    return {**batch, "scratch": batch["x"]}


class CountingDataModule:
    """A data module as Horovod's torch ranks use one: built with Horovod's keyword
    arguments, entered, ``train_data()``/``val_data()`` endless iterables of batch dicts."""

    built: ClassVar[List[dict]] = []

    def __init__(self, **kwargs) -> None:
        CountingDataModule.built.append(kwargs)
        self.kwargs = kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.kwargs["closed"] = True

    def _batches(self, size: int):
        gen = torch.Generator().manual_seed(self.kwargs["cur_shard"])
        while True:
            x = torch.randn(size, 3, generator=gen)
            yield {"x": x, "y": x @ torch.tensor([-3.0, 0.0, 2.0])}

    def train_data(self):
        return self._batches(self.kwargs["train_batch_size"])

    def val_data(self):
        return self._batches(self.kwargs["val_batch_size"])


def test_a_data_module_replaces_the_parquet_loader(prepared) -> None:
    CountingDataModule.built.clear()
    result = train(
        prepared,
        "dm",
        data_module=CountingDataModule,
        continuous_cols=["x"],
        categorical_cols=[],
        train_steps_per_epoch=25,
        epochs=4,
    )
    (kwargs,) = CountingDataModule.built
    assert kwargs["continuous_cols"] == ["x"] and kwargs["categorical_cols"] == []
    assert kwargs["cur_shard"] == 0 and kwargs["shard_count"] == 1
    assert kwargs["train_batch_size"] == 16 and kwargs["has_val"] is True
    assert kwargs["steps_per_epoch_train"] == 25
    # Horovod's validation steps: ceil(val_rows / val_batch_size / size)
    assert kwargs["steps_per_epoch_val"] == 2
    assert kwargs["closed"] is True
    # trained on the data module's rows (another function than the store's: the loss there
    # would be ~20), validated on its rows
    assert result["history"]["val_loss"][-1] < 1.0


def test_inmemory_cache_all_reads_the_store_once_and_reshuffles(prepared, monkeypatch) -> None:
    from kolo.estimator import _loaders

    seen = []
    original = _loaders.CachedLoader.__iter__

    def recording(self):
        cached = self._rows is not None
        for batch in original(self):
            if self.shuffle:  # the training loader's
                seen.append((cached, batch["y"].clone()))
            yield batch

    monkeypatch.setattr(_loaders.CachedLoader, "__iter__", recording)
    train(prepared, "cache", inmemory_cache_all=True, validation="is_val", epochs=3)
    assert len(seen) == 18
    epochs = [seen[i : i + 6] for i in range(0, 18, 6)]  # 96 rows / 16
    assert [cached for cached, _ in epochs[0]] == [False] * 6
    assert all(cached for epoch in epochs[1:] for cached, _ in epoch)
    rows = [torch.sort(torch.cat([y.reshape(-1) for _, y in epoch])).values for epoch in epochs]
    assert torch.equal(rows[0], rows[1]) and torch.equal(rows[1], rows[2])
    order = [torch.cat([y.reshape(-1) for _, y in epoch]) for epoch in epochs]
    assert not torch.equal(order[1], order[2])  # reshuffled every epoch


def test_transformation_fields_reader_settings_and_debug_log(prepared, caplog) -> None:
    caplog.set_level(logging.INFO, logger="kolo.estimator")
    before = multiprocessing.get_start_method(allow_none=True)
    fields = dict(
        transformation_fn=add_scratch,
        transformation_edit_fields=[("y", np.float64, (1,), False)],
        transformation_removed_fields=["scratch"],
    )
    try:
        result = train(
            prepared,
            "fields",
            **fields,
            reader_pool_type="dummy",
            train_async_data_loader_queue_size=1,
            debug_data_loader=True,
            mp_start_method="spawn",
            epochs=1,
        )
        assert multiprocessing.get_start_method() == "spawn"
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert len(result["history"]["train_loss"]) == 1
    text = caplog.text
    assert "reader_pool_type dummy, reader threads 1/1, queue sizes 1/None" in text
    assert "train loader batch 5: waited" in text and "train loader batch 6" not in text
    # what the rank's loop does to each batch after the transformation_fn
    store, meta = prepared
    model = torch.nn.Linear(3, 1)
    values = {
        **training_defaults(),
        **fields,
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.05),
        "loss": torch.nn.functional.mse_loss,
        "feature_cols": ["x"],
        "label_cols": ["y"],
        "use_gpu": False,
    }
    spec = build_torch_spec(values.__getitem__, store, "fields", meta)
    batch = {"x": torch.ones(4, 3), "y": torch.arange(4, dtype=torch.float32)}
    out = spec.transform_batch(batch, add_scratch)
    assert set(out) == {"x", "y"}
    assert out["y"].dtype == torch.float64 and out["y"].shape == (4, 1)


def test_bad_reader_pool_type_is_refused_on_the_driver(prepared) -> None:
    with pytest.raises(InvalidArgumentError, match=r"reader_pool_type='threads'.*'thread'"):
        train(prepared, "bad", reader_pool_type="threads")


def test_train_minibatch_fn_gets_horovods_nine_arguments(prepared, tmp_path) -> None:
    log_path = str(tmp_path / "calls")

    def minibatch(model, optimizer, transform_outputs, loss_fn, inputs, labels, weights, *rest):
        with open(log_path, "a") as f:  # the function runs as a copy: note the calls in a file
            f.write(f"{rest}\n")
        optimizer.zero_grad()
        outputs, labels = transform_outputs(model(*inputs), labels)
        loss = loss_fn(outputs, labels, weights)
        loss.backward()
        optimizer.step()
        return outputs, loss

    train(prepared, "minibatch", train_minibatch_fn=minibatch, backward_passes_per_step=2)
    with open(log_path) as f:
        calls = f.read().splitlines()
    # (backward_passes_per_step, batch_idx), batch_idx from 0 in every epoch
    assert calls[:7] == ["(2, 0)", "(2, 1)", "(2, 2)", "(2, 3)", "(2, 4)", "(2, 5)", "(2, 0)"]
