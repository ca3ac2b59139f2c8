"""kolo.data.prepare_data from Parquet/CSV paths, pyarrow Tables and pandas DataFrames into local
and S3 stores: row counts, seeded splits, balanced files, overwrite, and every bad input."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from support.asserts import raises_exactly

import kolo.data
from kolo.data import ColumnInfo, ColumnSpec
from kolo.data.prepare import PreparedData, prepare_data
from kolo.exceptions import DataError, InvalidArgumentError, StoreError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

ROWS = 500


def table(rows: int = ROWS) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "x": (ids / 2).astype(np.float32),
            "vec": pa.array([[float(i), float(i + 1)] for i in ids], pa.list_(pa.float32())),
            "label": ids % 3,
            "weight": np.ones(rows),
            "is_val": ids % 5 == 0,
            "name": [f"row{i}" for i in ids],
        }
    )


def read_dir(path: str) -> list[pa.Table]:
    """The part files of a local output directory, in name order."""
    local = Path(path.removeprefix("file://"))
    return [pq.read_table(p) for p in sorted(local.glob("part-*.parquet"))]


def ids_of(tables: list[pa.Table]) -> list[int]:
    return [i for t in tables for i in t.column("id").to_pylist()]


def prepare(store, source, **kwargs) -> PreparedData:
    kwargs.setdefault("feature_columns", ["id", "x", "vec"])
    kwargs.setdefault("label_columns", "label")
    return prepare_data(store, source, **kwargs)


@pytest.fixture
def parquet_source(tmp_path) -> Path:
    path = tmp_path / "source.parquet"
    pq.write_table(table(), path, row_group_size=128)
    return path


def test_parquet_path_ratio_split_is_complete_disjoint_balanced(tmp_path, parquet_source):
    prepared = prepare(
        tmp_path / "store",
        parquet_source,
        validation=0.2,
        sample_weight_col="weight",
        num_processes=3,
        partitions_per_process=2,
    )
    assert prepared.dataset_idx == 0
    assert prepared.train_rows + prepared.val_rows == ROWS
    assert 50 < prepared.val_rows < 150
    assert prepared.num_files == 6
    assert prepared.train_path.endswith("/store/intermediate_train_data.0")
    assert prepared.val_path.endswith("/store/intermediate_val_data.0")
    assert prepared.columns == {
        "id": ColumnInfo("id", "int64", ()),
        "x": ColumnInfo("x", "float32", ()),
        "vec": ColumnInfo("vec", "float32", (2,)),
        "label": ColumnInfo("label", "int64", ()),
        "weight": ColumnInfo("weight", "float64", ()),
    }
    vec = prepared.columns["vec"]
    assert type(vec) is ColumnInfo
    assert (vec.arrow_type, vec.uncompressed_bytes, vec.null_count, vec.problem) == (None,) * 4

    train, val = read_dir(prepared.train_path), read_dir(prepared.val_path)
    assert len(train) == 6
    sizes = [t.num_rows for t in train]
    assert max(sizes) - min(sizes) <= 1, sizes
    assert train[0].column_names == ["id", "x", "vec", "label", "weight"]
    train_ids, val_ids = set(ids_of(train)), set(ids_of(val))
    assert not train_ids & val_ids
    assert train_ids | val_ids == set(range(ROWS))
    assert len(val_ids) == prepared.val_rows
    local_train = Path(prepared.train_path.removeprefix("file://"))
    assert (local_train / "_SUCCESS").exists()


def test_ratio_split_is_seeded(tmp_path, parquet_source):
    store = tmp_path / "store"
    first = prepare(store, parquet_source, validation=0.3, seed=5)
    second = prepare(store, parquet_source, validation=0.3, seed=5)
    other = prepare(store, parquet_source, validation=0.3, seed=6)
    assert (first.dataset_idx, second.dataset_idx, other.dataset_idx) == (0, 1, 2)
    assert ids_of(read_dir(first.val_path)) == ids_of(read_dir(second.val_path))
    assert ids_of(read_dir(first.train_path)) == ids_of(read_dir(second.train_path))
    assert set(ids_of(read_dir(first.val_path))) != set(ids_of(read_dir(other.val_path)))


def test_split_by_column_drops_the_column(tmp_path):
    prepared = prepare(tmp_path / "store", table(), validation="is_val", num_processes=2)
    assert prepared.val_rows == ROWS // 5
    val = read_dir(prepared.val_path)
    assert all(i % 5 == 0 for i in ids_of(val))
    assert "is_val" not in val[0].column_names
    assert sorted(ids_of(read_dir(prepared.train_path)) + ids_of(val)) == list(range(ROWS))
    assert prepared.val_num_files == 4  # max(int(20 files * 0.2), 2 processes)


def test_csv_path(tmp_path):
    csv = tmp_path / "data.csv"
    csv.write_text("id,x,label\n" + "".join(f"{i},{i / 4},{i % 2}\n" for i in range(37)))
    prepared = prepare(
        str(tmp_path / "store"),
        str(csv),
        feature_columns=["id", "x"],
        num_processes=2,
        partitions_per_process=4,
    )
    assert (prepared.train_rows, prepared.val_rows, prepared.num_files) == (37, 0, 8)
    assert prepared.val_path is None
    train = read_dir(prepared.train_path)
    assert [t.num_rows for t in train] == [5, 5, 5, 5, 5, 4, 4, 4]
    assert ids_of(train) == list(range(37))
    assert prepared.columns["x"] == ColumnInfo("x", "float64", ())


def test_pyarrow_table_and_reader(tmp_path):
    prepared = prepare(tmp_path / "store", table(), partitions_per_process=5)
    assert prepared.train_rows == ROWS and prepared.num_files == 5
    assert ids_of(read_dir(prepared.train_path)) == list(range(ROWS))

    reader = pa.RecordBatchReader.from_batches(table().schema, table().to_batches(max_chunksize=64))
    prepared = prepare(tmp_path / "store", reader, dataset_idx=9)
    assert prepared.dataset_idx == 9 and prepared.train_rows == ROWS


def test_prepared_files_have_plain_pages_the_loader_reads_without_decoding(tmp_path):
    prepared = prepare(tmp_path / "store", table(), partitions_per_process=2)
    local = Path(prepared.train_path.removeprefix("file://"))
    for part in sorted(local.glob("part-*.parquet")):
        group = pq.ParquetFile(part).metadata.row_group(0)
        for i in range(group.num_columns):
            chunk = group.column(i)
            assert not chunk.has_dictionary_page, chunk.path_in_schema
            assert "PLAIN" in chunk.encodings, (chunk.path_in_schema, chunk.encodings)
    loader = kolo.data.ParquetLoader(prepared.train_path, ["x", "vec"], 50, to="numpy")
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["vec"][:, 1] - 1, batch["x"] * 2)


def test_pandas_dataframe(tmp_path):
    df = table().drop_columns(["vec"]).to_pandas()
    df.index = df.index + 1000  # the index is not written
    df["vec"] = [np.array([i, i * 2], dtype=np.float64) for i in range(ROWS)]
    prepared = prepare(tmp_path / "store", df, validation=0.1, num_processes=2)
    assert prepared.train_rows + prepared.val_rows == ROWS
    assert prepared.columns["vec"] == ColumnInfo("vec", "float64", (2,))
    train = read_dir(prepared.train_path)
    assert train[0].column_names == ["id", "x", "vec", "label"]
    assert sorted(ids_of(train) + ids_of(read_dir(prepared.val_path))) == list(range(ROWS))


def test_column_spec_is_column_info_and_both_describe_prepared_and_read_columns(tmp_path):
    assert ColumnSpec is ColumnInfo
    assert "ColumnInfo" in kolo.data.__all__ and "ColumnSpec" in kolo.data.__all__
    # Lists of bools pass the same rules as in the loader; a ragged list is written as (None,).
    source = pa.table(
        {
            "mask": pa.array([[True, False], [False, True]]),
            "n": pa.array([[1.0], [2.0, 3.0]]),
            "y": pa.array([0, 1]),
        }
    )
    prepared = prepare(tmp_path / "store", source, feature_columns=["mask", "n"], label_columns="y")
    assert prepared.columns["mask"] == ColumnSpec("mask", "bool", (2,))
    assert prepared.columns["n"] == ColumnInfo("n", "float64", (None,))
    meta = kolo.data.read_metadata(prepared.train_path)
    read = meta.columns["mask"]
    assert type(read) is ColumnInfo
    assert (read.name, read.dtype, read.shape) == ("mask", "bool", (2,))
    assert read.arrow_type is not None and read.problem is None


def test_fewer_rows_than_files(tmp_path):
    prepared = prepare(tmp_path / "store", table(7), num_processes=2, partitions_per_process=5)
    assert prepared.num_files == 7
    assert [t.num_rows for t in read_dir(prepared.train_path)] == [1] * 7


def test_overwrite(tmp_path, parquet_source):
    store = tmp_path / "store"
    prepare(store, parquet_source, dataset_idx=2, partitions_per_process=10)
    with pytest.raises(DataError, match=r"intermediate_train_data.2.*overwrite=True"):
        prepare(store, parquet_source, dataset_idx=2, overwrite=False)
    again = prepare(store, parquet_source, dataset_idx=2, partitions_per_process=3)
    assert len(read_dir(again.train_path)) == 3


def test_kolo_store_object(tmp_path, parquet_source):
    store_module = pytest.importorskip("kolo.store")
    store = store_module.Store.create(str(tmp_path / "store"))
    prepared = prepare(store, parquet_source)
    assert prepared.train_path == (tmp_path / "store" / "intermediate_train_data.0").as_uri()
    assert len(read_dir(prepared.train_path)) == 10


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"feature_columns": ["id", "missing"]},
            DataError,
            r"^feature column 'missing' is not in the source \(.*source\.parquet\); "
            r"available columns: id, x, vec, label, weight, is_val, name \(check",
        ),
        (
            {"label_columns": ["name"]},
            DataError,
            r"^label column 'name' has type Utf8(View)?; strings must be encoded as numbers",
        ),
        (
            {"sample_weight_col": "vec"},
            DataError,
            r"^sample weight column 'vec' has type List\(.*one number per row, not an array",
        ),
        (
            {"validation": "name"},
            DataError,
            r"^validation column 'name' has type Utf8(View)?; strings must be encoded",
        ),
        (
            {"validation": "nope"},
            DataError,
            r"^validation column 'nope' is not in the source \(.*source\.parquet\)",
        ),
        ({"validation": 1.0}, InvalidArgumentError, r"outside \[0, 1\)"),
        ({"validation": -0.5}, InvalidArgumentError, r"outside \[0, 1\)"),
        ({"num_processes": 0}, InvalidArgumentError, "num_processes"),
        ({"partitions_per_process": -1}, InvalidArgumentError, "partitions_per_process"),
        ({"compression": "lzo"}, InvalidArgumentError, "lzo"),
        ({"feature_columns": []}, InvalidArgumentError, "feature_columns"),
    ],
)
def test_bad_arguments(tmp_path, parquet_source, kwargs, error, match):
    with raises_exactly(error, match):
        prepare(tmp_path / "store", parquet_source, **kwargs)
    assert not (tmp_path / "store").exists()


def test_bad_data(tmp_path):
    store = tmp_path / "store"
    nulls = table(10).set_column(3, "label", pa.array([0, None, 1, None, 2, 0, 1, 2, 0, 1]))
    with raises_exactly(
        DataError,
        r"^column 'label' has 2 null value\(s\) in the Arrow stream \(table\); tensors cannot "
        r"hold missing values: fill or drop them",
    ):
        prepare(store, nulls)
    with raises_exactly(DataError, r"^the source \(.*\) is empty \(it has no rows\); check"):
        prepare(store, table(0))
    with raises_exactly(
        DataError,
        r"^the validation split is empty \(validation=0\.01 selected none of 3 rows\); use",
    ):
        prepare(store, table(3), validation=0.01)
    everything = table(10).set_column(5, "is_val", pa.array([True] * 10))
    with raises_exactly(
        DataError, r"^the train split is empty \(validation column 'is_val' took all 10 rows\)"
    ):
        prepare(store, everything, validation="is_val")
    holes = pa.table({"id": [1, 2], "vec": pa.array([[1.0, None], [2.0, 3.0]]), "label": [0, 1]})
    with raises_exactly(DataError, r"^column 'vec' has 1 null value\(s\) inside its lists in"):
        prepare(store, holes, feature_columns=["id", "vec"])
    assert not list(store.glob("intermediate_*/part-*"))


def test_bad_sources(tmp_path):
    store = tmp_path / "store"
    with raises_exactly(StoreError, r"missing\.parquet does not exist: .* check the path"):
        prepare(store, tmp_path / "missing.parquet")
    (tmp_path / "data.json").write_text("{}")
    with pytest.raises(DataError, match=r"data.json"):
        prepare(store, tmp_path / "data.json")
    with pytest.raises(TypeError, match="cannot prepare a dict"):
        prepare(store, {"id": [1]})
    with pytest.raises(TypeError, match=r"store must be a path, a URL or a kolo\.store\.Store"):
        prepare(42, table())


def test_s3_source_and_store(s3_prefix, tmp_path):
    boto3 = pytest.importorskip("boto3")
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_prefix.endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    key_prefix = s3_prefix.url.removeprefix(f"s3://{s3_prefix.bucket}/")
    sink = io.BytesIO()
    pq.write_table(table(), sink)
    s3.put_object(
        Bucket=s3_prefix.bucket, Key=f"{key_prefix}/raw/data.parquet", Body=sink.getvalue()
    )

    prepared = prepare_data(
        s3_prefix.url + "/store",
        s3_prefix.url + "/raw/data.parquet",
        feature_columns=["id", "x"],
        label_columns=["label"],
        validation=0.25,
        num_processes=2,
        partitions_per_process=2,
        storage_options=s3_prefix.storage_options,
    )
    assert prepared.train_path == f"{s3_prefix.url}/store/intermediate_train_data.0"
    listed = s3.list_objects_v2(Bucket=s3_prefix.bucket, Prefix=f"{key_prefix}/store/")
    keys = sorted(o["Key"].removeprefix(f"{key_prefix}/store/") for o in listed["Contents"])
    train_keys = [k for k in keys if k.startswith("intermediate_train_data.0/part-")]
    assert train_keys == [f"intermediate_train_data.0/part-{i:05d}.parquet" for i in range(4)]
    assert "intermediate_train_data.0/_SUCCESS" in keys
    ids = []
    for prefix in ("intermediate_train_data.0/", "intermediate_val_data.0/"):
        for key in (k for k in keys if k.startswith(prefix + "part-")):
            body = s3.get_object(Bucket=s3_prefix.bucket, Key=f"{key_prefix}/store/{key}")["Body"]
            ids += pq.read_table(io.BytesIO(body.read())).column("id").to_pylist()
    assert sorted(ids) == list(range(ROWS))

    # The next dataset index is found in the S3 store too.
    again = prepare_data(
        s3_prefix.url + "/store",
        table(),
        feature_columns="id",
        label_columns="label",
        storage_options=s3_prefix.storage_options,
    )
    assert again.dataset_idx == 1
