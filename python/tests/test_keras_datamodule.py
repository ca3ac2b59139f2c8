"""Horovod's Keras data modules (kolo.spark.keras.datamodule) on real Parquet data:
PetastormDataModule reads this shard with kolo's loader (columns, shuffling, validation,
transform_fn, make_dataset), NVTabularDataModule is refused with what to use instead, and its
static helpers work; MIN_PL_VERSION is checked at the Lightning estimator's construction."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kolo.exceptions
from kolo.spark.common.datamodule import DataModule
from kolo.spark.keras.datamodule import NVTabularDataModule, PetastormDataModule

ROWS = 120


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Horovod's prepared layout: a train and a val directory of Parquet part files."""
    root = tmp_path_factory.mktemp("prepared")
    ids = np.arange(ROWS, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids.astype(np.float32) / 2, "y": ids % 2})
    for name, part in (("train", table.slice(0, 100)), ("val", table.slice(100, 20))):
        folder = root / name
        folder.mkdir()
        for i, start in enumerate(range(0, part.num_rows, part.num_rows // 2)):
            pq.write_table(part.slice(start, part.num_rows // 2), folder / f"part-{i:05d}.parquet")
    return {"train_dir": str(root / "train"), "val_dir": str(root / "val")}


def module(prepared, **kwargs):
    settings = dict(train_batch_size=10, val_batch_size=10, **prepared)
    settings.update(kwargs)
    return PetastormDataModule(**settings)


def ids(batches):
    return [int(i) for batch in batches for i in batch["id"]]


def test_data_module_base_is_an_abstract_context_manager_with_horovods_constructor():
    class Listed(DataModule):
        def train_data(self):
            return [self.train_batch_size]

        def val_data(self):
            return None

    with pytest.raises(TypeError):
        DataModule(train_dir="t", val_dir="v")
    # Horovod's ranks pass more keyword arguments than the base takes (label_cols, ...)
    with Listed("t", "v", 2, False, 64, label_cols=["y"], random_seed=3) as dm:
        assert (dm.train_dir, dm.num_train_epochs, dm.has_val) == ("t", 2, False)
        assert dm.train_data() == [64] and dm.shuffle and dm.cur_shard == 0


def test_petastorm_module_reads_each_shard_once_and_validation_in_order(prepared):
    shards = []
    for shard in (0, 1):
        with module(prepared, cur_shard=shard, shard_count=2, random_seed=5) as dm:
            train = dm.train_data()
            assert len(train) == 5  # 50 rows of this shard in batches of 10
            first = ids(train)
            assert sorted(first) != first  # shuffled
            assert sorted(ids(train)) == sorted(first)  # each iteration: one epoch, same rows
            assert set(next(iter(train))) == {"id", "x", "y"}  # schema_fields=None: all
            assert isinstance(next(iter(train))["x"], np.ndarray)
            shards.append(set(first))
            val = ids(dm.val_data())
            assert val == sorted(val) and len(val) == 10
    assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == set(range(100))
    assert dm.train_reader is None  # closed on exit


def test_petastorm_module_same_seed_same_order_and_options(prepared):
    orders = []
    for _ in range(2):
        with module(prepared, random_seed=11, schema_fields=["id"]) as dm:
            batch = next(iter(dm.train_data()))
            assert set(batch) == {"id"}
            orders.append(ids(dm.train_data()))
    assert orders[0] == orders[1]
    with module(prepared, shuffle=False, has_val=False) as dm:
        assert ids(dm.train_data()) == list(range(100))
        assert dm.val_data() is None


def test_petastorm_module_applies_transform_fn_and_make_dataset(prepared):
    def transform(batch):
        return {"id": batch["id"], "x2": batch["x"] * 2}

    calls = []

    def make_dataset(reader, batch_size, is_batch_reader, shuffle=True, cache=False):
        calls.append((batch_size, is_batch_reader, shuffle, cache))
        return list(reader)

    with module(
        prepared,
        transform_fn=transform,
        make_dataset=make_dataset,
        inmemory_cache_all=True,
        val_batch_size=5,
    ) as dm:
        train = dm.train_data()
        assert set(train[0]) == {"id", "x2"}
        np.testing.assert_array_equal(train[0]["x2"], train[0]["id"].astype(np.float32))
        assert len(dm.val_data()) == 4
    assert calls == [(10, True, True, True), (5, True, False, True)]


def test_petastorm_module_errors_name_the_fix(prepared):
    dm = module(prepared)
    with pytest.raises(kolo.exceptions.InvalidArgumentError, match="with PetastormDataModule"):
        dm.train_data()
    with pytest.raises(kolo.exceptions.InvalidValueError, match="reader_pool_type"):
        module(prepared, reader_pool_type="threads")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module(prepared, reader_pool_type="process")
    assert any("no effect in kolo" in str(w.message) for w in caught)


def test_nvtabular_module_is_refused_with_what_to_use_instead():
    with pytest.raises(kolo.exceptions.InvalidArgumentError) as err:
        NVTabularDataModule(
            label_cols=["y"], categorical_cols=["c"], continuous_cols=["x"], train_dir="t"
        )
    assert "not supported by kolo" in str(err.value)
    assert "PetastormDataModule" in str(err.value)


def test_nvtabular_to_dense_pads_ragged_columns():
    values = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
    lengths = np.array([[1], [0], [3]])
    plain = np.array([7, 8, 9])
    X, labels = NVTabularDataModule.to_dense({"ragged": (values, lengths), "plain": plain}, "y")
    np.testing.assert_array_equal(
        X["ragged"], np.array([[1, 0, 0], [0, 0, 0], [2, 3, 4]], dtype=np.float32)
    )
    assert X["ragged"].dtype == np.float32
    assert X["plain"] is plain and labels == "y"


def test_lightning_estimator_checks_min_pl_version_at_construction(monkeypatch):
    import lightning.pytorch as pl

    from kolo.spark.lightning.estimator import MIN_PL_VERSION, TorchEstimator

    assert MIN_PL_VERSION == "2.0.0"
    TorchEstimator(num_proc=1)  # the installed Lightning is supported
    monkeypatch.setattr(pl, "__version__", "1.9.5")
    # Horovod raises RuntimeError here; kolo's error is one, and a ConfigError.
    with pytest.raises(RuntimeError, match=r"lightning>=2\.0\.0.*1\.9\.5") as info:
        TorchEstimator(num_proc=1)
    assert isinstance(info.value, kolo.exceptions.ConfigError)
