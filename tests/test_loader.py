"""kolo.data.ParquetLoader and kolo.data.read_metadata on real Parquet files (written with
pyarrow): row coverage per rank, shuffling, resuming, dtypes, zero-copy outputs, typed errors,
background errors, and a dataset in S3 (moto)."""

from __future__ import annotations

import itertools
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.asserts import raises_exactly

from kolo import _native
from kolo.data import ColumnInfo
from kolo.data.loader import ParquetLoader
from kolo.data.metadata import read_metadata
from kolo.exceptions import DataError, InvalidArgumentError, InvalidValueError, StoreError

ROWS = 300


def write_dataset(path: Path, rows: int = ROWS) -> Path:
    """Three Spark-like part files with uneven row groups, plus _SUCCESS and a .crc file."""
    path.mkdir(parents=True, exist_ok=True)
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table(
        {
            "id": ids,
            "x": ids.astype(np.float32) * 0.5,
            "y": ids.astype(np.float64) + 0.25,
            "small": (ids % 100).astype(np.int8),
            "u": (ids % 1000).astype(np.uint16),
            "h": ids.astype(np.float16),
            "flag": ids % 3 == 0,
            "vec": pa.array([[i, i + 0.5, i + 1.0] for i in ids], pa.list_(pa.float32())),
            "fixed": pa.array([[i % 7, -(i % 7)] for i in ids], pa.list_(pa.int32(), 2)),
            "name": [f"row{i}" for i in ids],
        }
    )
    cuts = [0, rows // 3, rows // 3 + rows // 2, rows]
    groups = [17, 40, 9]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        pq.write_table(
            table.slice(a, b - a), path / f"part-{i:05d}.parquet", row_group_size=groups[i]
        )
    (path / "_SUCCESS").write_bytes(b"")
    (path / ".part-00000.parquet.crc").write_bytes(b"crc")
    return path


def add_file(path: Path) -> None:
    """One more part file (same schema): the dataset changes."""
    pq.write_table(
        pq.read_table(path / "part-00002.parquet").slice(0, 1), path / "part-00009.parquet"
    )


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "data")


def ids_of(loader: ParquetLoader) -> list[list[int]]:
    return [[int(v) for v in batch["id"]] for batch in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_metadata_describes_files_row_groups_and_columns(dataset: Path) -> None:
    meta = read_metadata(dataset)
    assert meta.rows == ROWS
    assert [f.path for f in meta.files] == [f"part-{i:05d}.parquet" for i in range(3)]
    assert meta.files[0].row_groups == (17, 17, 17, 17, 17, 15)
    assert meta.row_groups == sum(len(f.row_groups) for f in meta.files)
    assert meta.bytes == sum(p.stat().st_size for p in dataset.glob("part-*"))
    assert (meta.columns["vec"].dtype, meta.columns["vec"].shape) == ("float32", (3,))
    assert (meta.columns["fixed"].dtype, meta.columns["fixed"].shape) == ("int32", (2,))
    assert (meta.columns["id"].dtype, meta.columns["id"].shape) == ("int64", ())
    assert (
        meta.columns["name"].dtype is None and meta.columns["name"].problem["kind"] == "unsupported"
    )
    vec = meta.columns["vec"]
    assert type(vec) is ColumnInfo and vec.name == "vec" and vec.problem is None
    assert vec.null_count == 0 and vec.uncompressed_bytes > 0 and vec.arrow_type.startswith("List")
    assert (dataset / "_kolo_metadata.json").exists()
    assert read_metadata(str(dataset)) == meta
    add_file(dataset)
    assert read_metadata(dataset).fingerprint != meta.fingerprint


@pytest.mark.parametrize("size", [1, 2, 3])
def test_every_row_exactly_once_per_epoch_with_equal_batches(dataset: Path, size: int) -> None:
    per_rank = []
    for rank in range(size):
        loader = ParquetLoader(
            dataset, ["id"], 7, rank=rank, size=size, drop_last=False, to="numpy", seed=3
        )
        batches = ids_of(loader)
        assert len(batches) == len(loader)
        assert loader.rows_per_epoch == ROWS // size
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1
    seen = Counter(i for batches in per_rank for batch in batches for i in batch)
    assert seen == Counter(range(ROWS))

    dropped = []
    for rank in range(size):
        loader = ParquetLoader(dataset, ["id"], 7, rank=rank, size=size, to="numpy")
        batches = ids_of(loader)
        assert all(len(b) == 7 for b in batches)
        assert len(batches) == ROWS // size // 7
        dropped.extend(i for batch in batches for i in batch)
    assert len(dropped) == len(set(dropped)) == size * (ROWS // size // 7) * 7


def test_shuffle_follows_seed_and_epoch(dataset: Path) -> None:
    a = ParquetLoader(dataset, ["id"], 10, seed=1, to="numpy")
    b = ParquetLoader(dataset, ["id"], 10, seed=1, to="numpy")
    c = ParquetLoader(dataset, ["id"], 10, seed=2, to="numpy")
    first, second = ids_of(a), ids_of(a)
    assert a.epoch == 2
    assert first == ids_of(b)
    assert first != second and sorted(flat(first)) == sorted(flat(second))
    assert first != ids_of(c)
    plain = ParquetLoader(dataset, ["id"], 10, shuffle=False, drop_last=False, to="numpy")
    assert flat(ids_of(plain)) == list(range(ROWS))


def test_num_epochs_runs_several_epochs_in_one_loop(dataset: Path) -> None:
    loader = ParquetLoader(dataset, ["id"], 50, num_epochs=2, to="numpy")
    assert len(ids_of(loader)) == 2 * len(loader)
    assert ids_of(loader) == []


def test_resume_continues_exactly_and_across_sizes(dataset: Path) -> None:
    rest_by_rank = []
    for rank in range(2):
        loader = ParquetLoader(dataset, ["id"], 8, rank=rank, size=2, drop_last=False, to="numpy")
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        assert (state["epoch"], state["offset"], state["size"]) == (0, 32, 2)
        rest = [int(i) for batch in it for i in batch["id"]]
        again = ParquetLoader(dataset, ["id"], 8, rank=rank, size=2, drop_last=False, to="numpy")
        again.load_state_dict(state)
        assert [int(i) for batch in again for i in batch["id"]] == rest
        assert again.epoch == 1
        rest_by_rank.append(rest)
    resumed = []
    counts = []
    for rank in range(3):
        loader = ParquetLoader(dataset, ["id"], 8, rank=rank, size=3, drop_last=False, to="numpy")
        loader.load_state_dict(state)
        batches = ids_of(loader)
        counts.append(len(batches))
        resumed.extend(i for batch in batches for i in batch)
    assert len(set(counts)) == 1
    # 2 x 118 rows were left; 236 rows over 3 ranks: 79 each, one row wraps around.
    left = Counter(i for rest in rest_by_rank for i in rest)
    got = Counter(resumed)
    assert set(got) == set(left)
    assert sum(got.values()) == 3 * 79
    assert got - left == Counter({next(iter(got - left)): 1})


def test_a_changed_dataset_refuses_an_old_state(dataset: Path) -> None:
    loader = ParquetLoader(dataset, ["id"], 8, to="numpy")
    next(iter(loader))
    state = loader.state_dict()
    add_file(dataset)
    with pytest.raises(DataError, match="changed"):
        ParquetLoader(dataset, ["id"], 8, to="numpy").load_state_dict(state)


def test_torch_and_numpy_outputs_have_dtypes_and_shapes(dataset: Path) -> None:
    torch = pytest.importorskip("torch")
    columns = ["x", "id", "y", "small", "u", "h", "flag", "vec", "fixed"]
    batch = next(iter(ParquetLoader(dataset, columns, 16, to="numpy")))
    assert list(batch) == columns
    dtypes = {k: (v.dtype.name, v.shape) for k, v in batch.items()}
    assert dtypes == {
        "x": ("float32", (16,)),
        "id": ("int64", (16,)),
        "y": ("float64", (16,)),
        "small": ("int8", (16,)),
        "u": ("uint16", (16,)),
        "h": ("float16", (16,)),
        "flag": ("bool", (16,)),
        "vec": ("float32", (16, 3)),
        "fixed": ("int32", (16, 2)),
    }
    ids = batch["id"]
    np.testing.assert_array_equal(batch["x"], ids.astype(np.float32) * 0.5)
    np.testing.assert_array_equal(batch["flag"], ids % 3 == 0)
    np.testing.assert_array_equal(batch["vec"][:, 1], ids + 0.5)
    np.testing.assert_array_equal(batch["fixed"][:, 1], -(ids % 7))
    tbatch = next(iter(ParquetLoader(dataset, columns, 16, to="torch")))
    assert tbatch["x"].dtype == torch.float32 and tbatch["vec"].shape == (16, 3)
    assert tbatch["flag"].dtype == torch.bool and tbatch["h"].dtype == torch.float16
    assert torch.equal(tbatch["x"], tbatch["id"].to(torch.float32) * 0.5)


def test_outputs_are_views_of_the_native_buffers(dataset: Path) -> None:
    torch = pytest.importorskip("torch")
    batch = next(iter(ParquetLoader(dataset, ["x", "id", "vec"], 16, to="numpy")))
    for name in ("x", "vec"):
        base = batch[name]
        while isinstance(base, np.ndarray):
            assert not base.flags.owndata
            base = base.base
        assert isinstance(base, _native.BufferView)
    # Scalar columns of one dtype are rows of one [columns, rows] buffer.
    stacked = next(iter(ParquetLoader(dataset, ["x", "id", "small", "u"], 16, to="numpy")))
    assert np.shares_memory(stacked["x"], stacked["x"].base)
    # Torch tensors too: batches of one shuffle window (the whole epoch here) are consecutive
    # rows of its buffers, so no batch was copied.
    batches = iter(ParquetLoader(dataset, ["x", "vec"], 16, to="torch"))
    first, second = next(batches), next(batches)
    assert first["x"].dtype == torch.float32 and tuple(first["x"].shape) == (16,)
    assert second["x"].data_ptr() - first["x"].data_ptr() == 16 * 4
    assert first["vec"].is_contiguous() and tuple(first["vec"].shape) == (16, 3)
    assert second["vec"].data_ptr() - first["vec"].data_ptr() == 16 * 3 * 4


def write_features(path: Path, rows: int = 301) -> Path:
    """Two part files of float32 features ``a = id``, ``b = 2 id + 0.5``, ``c = -id``, an
    int64 ``id`` and a float32 array ``vec``, in uneven row groups."""
    path.mkdir(parents=True, exist_ok=True)
    ids = np.arange(rows, dtype=np.int64)
    f = ids.astype(np.float32)
    table = pa.table(
        {
            "a": f,
            "b": 2 * f + 0.5,
            "c": -f,
            "id": ids,
            "vec": pa.array([[i, i + 0.5] for i in f], pa.list_(pa.float32(), 2)),
        }
    )
    pq.write_table(table.slice(0, 120), path / "part-00000.parquet", row_group_size=50)
    pq.write_table(table.slice(120), path / "part-00001.parquet", row_group_size=64)
    return path


@pytest.mark.parametrize("to", ["numpy", "torch"])
def test_stack_gives_one_row_major_feature_tensor_in_the_columns_order(
    tmp_path: Path, to: str
) -> None:
    # Batches of 16 in windows of 40 (some batches views of a window, others copied from
    # two), rank 1 of 2 without drop_last (a last partial batch wrapping to row 0), two
    # epochs: the stacked loader hands out the same rows in the same order as the columnar one.
    torch = pytest.importorskip("torch") if to == "torch" else None
    path = write_features(tmp_path / "features")
    columns = ["a", "id", "b", "c", "vec"]
    kwargs = dict(
        batch_size=16,
        rank=1,
        size=2,
        seed=3,
        drop_last=False,
        num_epochs=2,
        to=to,
        shuffle_buffer_size=40,
    )
    stacked = list(ParquetLoader(path, columns, stack="features", **kwargs))
    columnar = list(ParquetLoader(path, columns, **kwargs))
    assert len(stacked) == len(columnar) == 20
    assert [len(b["id"]) for b in stacked[:10]] == [16] * 9 + [7]
    for got, want in zip(stacked, columnar):
        assert list(got) == ["features", "id", "vec"]
        features = got["features"]
        rows = len(want["id"])
        if torch is not None:
            assert features.dtype == torch.float32 and features.is_contiguous()
            features, ids = features.numpy(), got["id"].numpy()
            want = {k: v.numpy() for k, v in want.items()}
        else:
            assert features.dtype == np.float32 and features.flags.c_contiguous
            ids = got["id"]
        assert features.shape == (rows, 3)
        np.testing.assert_array_equal(ids, want["id"])
        np.testing.assert_array_equal(features, np.stack([want[c] for c in "abc"], axis=1))
        f = ids.astype(np.float32)
        np.testing.assert_array_equal(features, np.stack([f, 2 * f + 0.5, -f], axis=1))
        np.testing.assert_array_equal(got["vec"], want["vec"])


@pytest.mark.parametrize(
    "columns, stack, error, words",
    [
        (["a", "b"], "a", InvalidValueError, ["stack='a'", "also a selected column"]),
        (["a", "b"], 3, InvalidValueError, ["stack=3", "name of the stacked tensor"]),
        (["vec"], "features", InvalidArgumentError, ["stack needs a scalar column", "vec"]),
    ],
)
def test_bad_stack_raises_a_named_error(
    tmp_path: Path, columns: list[str], stack: object, error: type, words: list[str]
) -> None:
    path = write_features(tmp_path / "features")
    with raises_exactly(error) as info:
        ParquetLoader(path, columns, 16, rank=0, size=1, to="numpy", stack=stack)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("compression", ["none", "snappy"])
def test_plain_pages_load_the_rows_of_the_table(tmp_path: Path, compression: str) -> None:
    # PLAIN pages are used without decoding (uncompressed: straight from the mapped file).
    # Every row of both epochs must hold the table's values, for batches inside one shuffle
    # window (views) and across two (copies): windows of 40 rows, batches of 16, pages of a
    # few rows so windows span several pages.
    table = pq.read_table(write_dataset(tmp_path / "source"))
    plain = tmp_path / "plain"
    plain.mkdir()
    for i, part in enumerate((table.slice(0, 130), table.slice(130))):
        pq.write_table(
            part,
            plain / f"part-{i}.parquet",
            row_group_size=50,
            use_dictionary=False,
            compression=compression,
            data_page_size=256,
        )
    columns = ["x", "id", "y", "vec", "fixed", "small"]
    expected = {c: table.column(c).to_numpy(zero_copy_only=False) for c in columns}
    loader = ParquetLoader(
        plain, columns, 16, shuffle_buffer_size=40, num_epochs=2, seed=3, to="numpy"
    )
    seen = []
    for batch in loader:
        ids = batch["id"]
        seen.extend(ids.tolist())
        for c in columns:
            want = np.stack(expected[c][ids]) if batch[c].ndim == 2 else expected[c][ids]
            np.testing.assert_array_equal(batch[c], want, err_msg=c)
    assert len(seen) == 2 * 288 and len(set(seen[:288])) == 288


@pytest.mark.parametrize("compression, passes", [("none", 1), ("snappy", 2)])
def test_plain_uncompressed_pages_are_copied_once_per_epoch(
    tmp_path: Path, compression: str, passes: int
) -> None:
    # Issue 24 item 5: the bytes the loader writes. Uncompressed PLAIN pages are gathered
    # straight from the mapped file into the shuffle windows, whose batches are views: one
    # pass over each row's 24 bytes per epoch. Snappy pages are decompressed first: two.
    table = pq.read_table(write_dataset(tmp_path / "source"))
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(table, plain / "part-0.parquet", use_dictionary=False, compression=compression)
    loader = ParquetLoader(
        plain, ["x", "id", "vec"], 20, shuffle_buffer_size=60, num_epochs=2, to="torch"
    )
    assert loader.bytes_copied == 0
    rows = sum(len(batch["id"]) for batch in loader)
    assert rows == 2 * ROWS
    assert loader.bytes_copied == passes * rows * (4 + 8 + 12)


def test_batches_inside_a_shuffle_window_are_views_of_it(tmp_path: Path) -> None:
    table = pq.read_table(write_dataset(tmp_path / "source"))
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(table, plain / "part-0.parquet", use_dictionary=False)
    loader = ParquetLoader(plain, ["x", "id", "vec"], 16, shuffle_buffer_size=64, to="numpy")
    first, second = itertools.islice(loader, 2)
    for name, row_bytes in (("x", 4), ("vec", 12)):
        a = first[name].__array_interface__["data"][0]
        b = second[name].__array_interface__["data"][0]
        assert b - a == 16 * row_bytes, f"{name}: batch 2 follows batch 1 in the window"
    # A stacked scalar column steps over the window's rows; it stays writable for torch.
    assert first["x"].strides == (4,) and first["x"].flags.writeable
    np.testing.assert_array_equal(first["x"], first["id"].astype(np.float32) * 0.5)
    np.testing.assert_array_equal(second["vec"][:, 2], second["id"] + 1.0)


@pytest.mark.parametrize(
    ("columns", "batch_size", "size", "error", "words"),
    [
        (
            ["id", "missing"],
            4,
            1,
            DataError,
            ["selected column 'missing' is not in the dataset file://", "available", "vec"],
        ),
        (["name"], 4, 1, DataError, ["selected column 'name' has type Utf8; strings", "encode"]),
        (["id"], 200, 2, DataError, ["300 rows", "batch_size", "drop_last=False"]),
    ],
)
def test_bad_columns_and_sizes_raise_named_errors(
    dataset: Path, columns: list[str], batch_size: int, size: int, error: type, words: list[str]
) -> None:
    with raises_exactly(error) as info:
        ParquetLoader(dataset, columns, batch_size, rank=0, size=size, to="numpy")
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"columns": 100}, ["columns=100", "list of column names"]),
        ({"columns": ["id", 3]}, ["columns=['id', 3]"]),
        ({"columns": ["id"], "to": "jax"}, ["to='jax'", '"torch" or "numpy"']),
    ],
)
def test_bad_column_lists_and_outputs_raise_invalid_value(
    dataset: Path, kwargs: dict, words: list[str]
) -> None:
    args = {"batch_size": 4, "rank": 0, "size": 1, "to": "numpy", **kwargs}
    with raises_exactly(InvalidValueError) as info:
        ParquetLoader(dataset, **args)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("use_dictionary", [True, False], ids=["dictionary", "plain"])
def test_nulls_and_ragged_arrays_name_column_and_file(tmp_path: Path, use_dictionary: bool) -> None:
    good = pa.table({"a": pa.array([1.0, 2.0]), "v": pa.array([[1, 2], [3, 4]])})
    bad = pa.table({"a": pa.array([1.0, None]), "v": pa.array([[1, 2], [3]])})
    for name, table in (("part-0.parquet", good), ("part-1.parquet", bad)):
        pq.write_table(table, tmp_path / name, use_dictionary=use_dictionary)
    with raises_exactly(
        DataError, r"^column 'a' has 1 null value\(s\) in file://.*part-1\.parquet;"
    ):
        ParquetLoader(tmp_path, ["a"], 1, to="numpy")
    with raises_exactly(DataError) as info:
        ParquetLoader(tmp_path, ["v"], 1, to="numpy")
    message = str(info.value)
    assert "'v'" in message and "part-1" in message and "length 1" in message and "2" in message


def test_empty_and_unreadable_datasets(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_bytes(b"")
    with raises_exactly(
        DataError, r"^the dataset file://.*/empty is empty \(it holds no data files"
    ):
        ParquetLoader(tmp_path / "empty", ["id"], 1, to="numpy")
    write_dataset(tmp_path / "zero", rows=0)
    with raises_exactly(DataError, r"/zero is empty \(its 3 data file\(s\) hold no rows\)"):
        ParquetLoader(tmp_path / "zero", ["id"], 1, to="numpy")
    with raises_exactly(StoreError, r"/nowhere does not exist: .*check the path"):
        ParquetLoader(tmp_path / "nowhere", ["id"], 1, to="numpy")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "part-0.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"part-0\.parquet"):
        read_metadata(tmp_path / "junk")


def test_a_read_error_in_the_background_surfaces_on_next(dataset: Path) -> None:
    loader = ParquetLoader(dataset, ["id"], 4, to="numpy", prefetch=1)
    target = dataset / "part-00001.parquet"
    target.write_bytes(b"\0" * target.stat().st_size)
    with pytest.raises(DataError, match="part-00001"):
        for _ in loader:
            pass


def test_defaults_to_rank_0_of_1_without_init(dataset: Path) -> None:
    loader = ParquetLoader(dataset, "id", 30, to="numpy")
    assert len(loader) == ROWS // 30 and loader.state_dict()["size"] == 1


def test_loader_reads_from_s3(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    try:
        s3 = request.getfixturevalue("s3_prefix")
    except pytest.FixtureLookupError:
        pytest.skip("the s3_prefix fixture (tests/support/emulators.py) is not available")
    store_module = pytest.importorskip("kolo.store")
    local = write_dataset(tmp_path / "data")
    store = store_module.Store.create(s3.url, storage_options=s3.storage_options)
    for name in sorted(os.listdir(local)):
        store.write_bytes(f"{s3.url}/data/{name}", (local / name).read_bytes())
    url = f"{s3.url}/data"
    meta = read_metadata(url, storage_options=s3.storage_options)
    assert meta.rows == ROWS and len(meta.files) == 3
    loader = ParquetLoader(
        url, ["id", "vec"], 16, drop_last=False, to="numpy", storage_options=s3.storage_options
    )
    ids = [int(i) for batch in loader for i in batch["id"]]
    assert sorted(ids) == list(range(ROWS))
