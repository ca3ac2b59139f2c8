"""kolo.store (and its Horovod alias kolo.spark.common.store): round trips through local, DBFS,
S3 (moto), GCS (fake-gcs-server), Azure (Azurite) and HDFS (MiniDFSCluster) stores; atomic
checkpoint writes under SIGKILL; changed-files-only sync; pickling; bad input."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support.relay import Relay

import kolo.spark.common.store as horovod_store
from kolo import _native
from kolo.estimator.spec import checkpoint_file
from kolo.exceptions import KoloError, StoreError
from kolo.store import (
    DBFSLocalStore,
    FilesystemStore,
    HDFSStore,
    LocalStore,
    Store,
    SyncReport,
)

BACKENDS = ("local", "dbfs", "s3", "gcs", "azure", "hdfs")


@pytest.fixture
def dbfs_mount(tmp_path, monkeypatch) -> Path:
    """A temporary directory standing in for the Databricks /dbfs mount."""
    mount = tmp_path / "dbfs-mount"
    mount.mkdir()
    monkeypatch.setenv("KOLO_DBFS_MOUNT", str(mount))
    return mount


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path) -> tuple[str, dict]:
    """(prefix URL, storage_options) of a fresh prefix on each backend in turn."""
    if request.param == "local":
        return str(tmp_path / "store"), {}
    if request.param == "dbfs":
        request.getfixturevalue("dbfs_mount")
        return "dbfs:/experiments/store", {}
    emulator = request.getfixturevalue(f"{request.param}_prefix")
    return emulator.url, dict(emulator.storage_options)


def test_round_trip_on_every_backend(location, tmp_path):
    url, options = location
    store = Store.create(url, storage_options=options)
    run = "run_1"
    checkpoint = checkpoint_file(store, run)
    assert checkpoint == f"{store.prefix_path}/runs/{run}/{store.get_checkpoint_filename()}"
    assert not store.exists(checkpoint)

    store.write_bytes(checkpoint, b"epoch-1")
    assert store.read(checkpoint) == b"epoch-1"
    store.write_bytes(checkpoint, b"epoch-2 weights")
    assert store.read(checkpoint) == b"epoch-2 weights"
    store.write_text(store.get_logs_path(run) + "/metrics.json", '{"loss": 0.5}')
    assert store.read_text(store.get_logs_path(run) + "/metrics.json") == '{"loss": 0.5}'
    assert store.exists(store.get_run_path(run)), "a non-empty run directory exists"
    assert store.list(store.get_run_path(run)) == [
        checkpoint,
        store.get_logs_path(run) + "/metrics.json",
    ]

    # Changed-files-only sync of a local run directory to the run path. The files are dated a
    # minute back, so a fresh Store (another process) also sees the uploads as current.
    local = tmp_path / "local-run"
    (local / "logs").mkdir(parents=True)
    (local / "model.pt").write_bytes(b"m" * 1000)
    (local / "logs" / "events.1").write_bytes(b"e1")
    a_minute_ago = time.time() - 60
    for path in (local / "model.pt", local / "logs" / "events.1"):
        os.utime(path, (a_minute_ago, a_minute_ago))
    sync = store.sync_fn(run)
    assert sync(str(local)) == SyncReport(["logs/events.1", "model.pt"], [], 1002)
    assert sync(str(local)) == SyncReport([], ["logs/events.1", "model.pt"], 0)
    in_new_process = pickle.loads(pickle.dumps(sync))
    assert in_new_process(str(local)) == SyncReport([], ["logs/events.1", "model.pt"], 0)
    (local / "model.pt").write_bytes(b"n" * 1001)
    (local / "logs" / "events.2").write_bytes(b"e2")
    changed = sync(str(local))
    assert changed == SyncReport(["logs/events.2", "model.pt"], ["logs/events.1"], 1003)
    assert store.read(store.get_run_path(run) + "/model.pt") == b"n" * 1001

    # The store travels to another process as its arguments and works there.
    clone = pickle.loads(pickle.dumps(store))
    assert type(clone) is type(store) and clone.prefix_path == store.prefix_path
    assert clone.read(checkpoint) == b"epoch-2 weights"

    store.delete(store.get_logs_path(run))
    assert not store.exists(store.get_logs_path(run) + "/metrics.json")
    assert store.exists(checkpoint)
    store.delete(store.get_run_path(run))
    assert not store.exists(checkpoint)
    assert store.list(store.get_runs_path()) == []
    store.delete(store.get_run_path("never-existed"))


def test_layout_matches_horovod(tmp_path):
    store = FilesystemStore(str(tmp_path))
    prefix = str(tmp_path)
    assert store.get_train_data_path() == f"{prefix}/intermediate_train_data"
    assert store.get_train_data_path(0) == f"{prefix}/intermediate_train_data.0"
    assert store.get_val_data_path(2) == f"{prefix}/intermediate_val_data.2"
    assert store.get_test_data_path(1) == f"{prefix}/intermediate_test_data.1"
    assert store.get_runs_path() == f"{prefix}/runs"
    assert store.get_run_path("r") == f"{prefix}/runs/r"
    # Horovod's meaning: the run directory; the file name is joined by the caller.
    assert store.get_checkpoint_path("r") == f"{prefix}/runs/r"
    assert store.get_checkpoint_filename() == "checkpoint"
    assert store.get_logs_path("r") == f"{prefix}/runs/r/logs"
    assert store.get_logs_subdir() == "logs"
    assert store.saving_runs()
    remote = store.to_remote("r", 3)
    assert remote.train_data_path == f"{prefix}/intermediate_train_data.3"
    assert remote.checkpoint_path == f"{prefix}/runs/r"
    assert remote.checkpoint_filename == "checkpoint"

    custom = FilesystemStore(
        "s3://bucket/exp",
        train_path="s3://other/train",
        runs_path="s3://bucket/elsewhere",
        save_runs=False,
    )
    assert custom.get_train_data_path(0) == "s3://other/train.0"
    assert custom.get_val_data_path() == "s3://bucket/exp/intermediate_val_data"
    assert custom.get_run_path("r") == "s3://bucket/elsewhere/r"
    assert custom.get_checkpoint_path("r") is None and custom.get_logs_path("r") is None


def test_create_dispatches_like_horovod(dbfs_mount):
    assert type(Store.create("hdfs://127.0.0.1:8020/user/me")) is HDFSStore
    for path in ("dbfs:/x", "/dbfs/x", "file:///dbfs/x", "file:/dbfs/x"):
        store = Store.create(path)
        assert type(store) is DBFSLocalStore and store.prefix_path == "/dbfs/x", path
        assert store.get_checkpoint_filename() == "checkpoint.tf"
    assert type(Store.create("s3://bucket/x")) is FilesystemStore
    assert type(Store.create("/tmp/x")) is FilesystemStore
    assert isinstance(LocalStore("/tmp/x"), FilesystemStore)
    assert horovod_store.Store is Store and horovod_store.HDFSStore is HDFSStore


def test_dbfs_forms_all_reach_the_mount(dbfs_mount):
    store = Store.create("dbfs:/ml/exp")
    checkpoint = checkpoint_file(store, "r")
    assert checkpoint == "/dbfs/ml/exp/runs/r/checkpoint.tf"
    store.write_bytes("dbfs:/ml/exp/runs/r/checkpoint.tf", b"saved")
    on_disk = dbfs_mount / "ml" / "exp" / "runs" / "r" / "checkpoint.tf"
    assert on_disk.read_bytes() == b"saved"
    for form in (
        checkpoint,
        "dbfs:/ml/exp/runs/r/checkpoint.tf",
        "file:///dbfs/ml/exp/runs/r/checkpoint.tf",
    ):
        assert store.exists(form), form
        assert store.read(form) == b"saved", form
    assert not Path("/dbfs/ml/exp").exists() or Path("/dbfs") == dbfs_mount


def test_paths_outside_the_prefix_and_relative_paths(tmp_path, monkeypatch):
    store = FilesystemStore(str(tmp_path / "a"))
    other = tmp_path / "b" / "file.txt"
    store.write_text(str(other), "outside")
    assert other.read_text() == "outside"
    assert store.read(f"file://{other}") == b"outside"
    monkeypatch.chdir(tmp_path)
    relative = FilesystemStore("a")
    relative.write_text(relative.get_run_path("r") + "/x", "rel")
    assert (tmp_path / "a" / "runs" / "r" / "x").read_text() == "rel"
    assert store.read(str(tmp_path / "a" / "runs" / "r" / "x")) == b"rel"


def test_is_parquet_dataset(tmp_path):
    store = FilesystemStore(str(tmp_path))
    data = store.get_train_data_path(0)
    assert not store.is_parquet_dataset(data)
    store.write_bytes(data + "/_SUCCESS", b"")
    assert not store.is_parquet_dataset(data)
    store.write_bytes(data + "/part-00000.parquet", b"PAR1")
    assert store.is_parquet_dataset(data)
    assert store.is_parquet_dataset(data + "/part-00000.parquet")
    assert not store.is_parquet_dataset(store.get_val_data_path(0))


def test_every_store_class_pickles(tmp_path, dbfs_mount):
    stores = [
        Store(str(tmp_path / "s"), save_runs=False),
        FilesystemStore(str(tmp_path / "f"), storage_options={"aws_region": "us-east-1"}),
        LocalStore(str(tmp_path / "l"), runs_path=str(tmp_path / "runs")),
        DBFSLocalStore("dbfs:/p"),
        HDFSStore(
            "/user/me/exp",
            host="127.0.0.1",
            port=9000,
            user="me",
            extra_conf={"dfs.client.use.datanode.hostname": "false"},
            temp_dir=str(tmp_path),
        ),
        FilesystemStore("s3://bucket/exp", storage_options={"aws_allow_http": True}),
    ]
    for store in stores:
        store.get_run_path("r")
        clone = pickle.loads(pickle.dumps(store))
        assert type(clone) is type(store)
        assert clone.prefix_path == store.prefix_path
        assert clone.storage_options == store.storage_options
        for method in ("get_train_data_path", "get_runs_path", "saving_runs"):
            assert getattr(clone, method)() == getattr(store, method)()
        assert clone.get_checkpoint_path("r") == store.get_checkpoint_path("r")
    hdfs = pickle.loads(pickle.dumps(stores[4]))
    assert hdfs.prefix_path == "hdfs:///user/me/exp"
    assert hdfs.native_location() == (
        "hdfs://127.0.0.1:9000/user/me/exp",
        {"dfs.client.use.datanode.hostname": "false"},
    )
    # A used store (native handle built) pickles too, and the clone still works.
    used = stores[0]
    used.write_text(used.get_train_data_path() + "/x", "1")
    assert pickle.loads(pickle.dumps(used)).read(used.get_train_data_path() + "/x") == b"1"


def test_hdfs_store_from_path_and_namenode_arguments(hdfs_server):
    namenode = hdfs_server.endpoint  # hdfs://127.0.0.1:PORT
    host, port = namenode.removeprefix("hdfs://").split(":")
    base = "/" + hdfs_server.bucket
    store = HDFSStore(base + "/by-args", host=host, port=int(port), driver="libhdfs")
    assert store.prefix_path == f"hdfs://{base}/by-args"
    store.write_text(checkpoint_file(store, "r"), "hdfs!")
    # Horovod's localized form (no scheme) maps to the same object.
    assert store.read(f"{base}/by-args/runs/r/checkpoint") == b"hdfs!"
    full = HDFSStore(f"{namenode}{base}/by-args")
    assert full.read(checkpoint_file(full, "r")) == b"hdfs!"
    assert (
        full.get_localized_path(checkpoint_file(full, "r")) == f"{base}/by-args/runs/r/checkpoint"
    )


# -- atomic writes under SIGKILL ----------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys
    from kolo.store import Store
    url, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    options = dict(arg.split("=", 1) for arg in sys.argv[4:])
    store = Store(url, storage_options=options)
    payload = b"n" * size
    print("writing", flush=True)
    store.write_bytes(path, payload)
    print("done", flush=True)
    """
)
BIG = 200 * 1024 * 1024


def kill_mid_write(store: Store, path: str, ready=None, delay: float = 0.0) -> None:
    """Starts a child writing BIG bytes at ``path`` and SIGKILLs it in the middle."""
    args = [f"{k}={v}" for k, v in (store.storage_options or {}).items()]
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, store.prefix_path, path, str(BIG), *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 30
        while ready is not None and not ready():
            assert child.poll() is None, "the writer finished before it was seen writing"
            assert time.monotonic() < deadline, "never saw the write in progress"
            time.sleep(0.001)
        time.sleep(delay)
        assert child.poll() is None, "the writer finished before the kill: the test proves nothing"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_sigkill_mid_write_keeps_the_previous_local_checkpoint(tmp_path):
    store = FilesystemStore(str(tmp_path / "store"))
    checkpoint = checkpoint_file(store, "r")
    store.write_bytes(checkpoint, b"previous checkpoint")
    run_dir = Path(checkpoint).parent

    def staging_file_present() -> bool:
        # object_store stages a local write in `<name>#<n>` and renames it when complete.
        return any(p.name.startswith("checkpoint#") for p in run_dir.iterdir())

    kill_mid_write(store, checkpoint, ready=staging_file_present)
    assert store.read(checkpoint) == b"previous checkpoint"
    assert store.list(store.get_run_path("r")) == [checkpoint], "the staging file is not listed"
    store.write_bytes(checkpoint, b"next")
    assert store.read(checkpoint) == b"next"


class SlowRelay(Relay):
    """A relay to ``port`` that passes the client's bytes at ``rate`` bytes/s (the replies as
    they come) and counts them: a write through it is still in flight for seconds, whatever
    the machine's speed."""

    def __init__(self, port: int, rate: float) -> None:
        self.rate, self.sent = rate, 0
        super().__init__(("127.0.0.1", port), upstream=self._throttle)
        self.address = f"http://127.0.0.1:{self.port}"

    def _throttle(self, data: bytes) -> None:
        time.sleep(len(data) / self.rate)
        self.sent += len(data)


def test_sigkill_mid_write_keeps_the_previous_s3_checkpoint(s3_prefix):
    store = FilesystemStore(s3_prefix.url, storage_options=s3_prefix.storage_options)
    checkpoint = checkpoint_file(store, "r")
    store.write_bytes(checkpoint, b"previous checkpoint")
    # The killed writer goes through a relay at 40 MB/s: 200 MiB take 5 s, so the kill lands
    # while the body is on its way (S3 replaces an object only when a whole PUT arrived).
    port = int(s3_prefix.storage_options["aws_endpoint"].rsplit(":", 1)[1])
    relay = SlowRelay(port, rate=40e6)
    try:
        options = {**s3_prefix.storage_options, "aws_endpoint": relay.address}
        slow = FilesystemStore(s3_prefix.url, storage_options=options)
        kill_mid_write(slow, checkpoint, ready=lambda: relay.sent > 0, delay=0.3)
        assert 0 < relay.sent < BIG, f"{relay.sent} of {BIG} bytes sent when the writer died"
    finally:
        relay.close()
    assert store.read(checkpoint) == b"previous checkpoint"
    assert store.list(store.get_run_path("r")) == [checkpoint]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("ftp://host/dir", "unsupported store scheme"),
        ("s3://bad host/x", "malformed store URL"),
        ("s3:///no-bucket", "names no bucket"),
        ("dbfs://workspace/x", "dbfs:/path"),
        ("file://otherhost/x", "three slashes"),
        ("", "empty"),
    ],
)
def test_bad_locations_raise_store_error(location, message):
    with pytest.raises(StoreError, match=message) as info:
        Store.create(location)
    assert location in str(info.value)
    assert isinstance(info.value, KoloError)


def test_bad_options_raise_store_error(tmp_path):
    with pytest.raises(StoreError, match="aws_acess_key_id"):
        FilesystemStore("s3://b/x", storage_options={"aws_acess_key_id": "k"}).exists("s3://b/x/y")
    with pytest.raises(StoreError, match="client_kwargs"):
        FilesystemStore("s3://b/x", storage_options={"client_kwargs": {"endpoint_url": "x"}})
    with pytest.raises(StoreError, match="absolute"):
        HDFSStore("relative/path")


def test_missing_object_names_the_path(tmp_path):
    store = FilesystemStore(str(tmp_path))
    missing = checkpoint_file(store, "nope")
    with pytest.raises(StoreError, match="no object at") as info:
        store.read(missing)
    assert "runs/nope/checkpoint" in str(info.value)


def test_missing_s3_bucket_says_so(s3_server):
    store = FilesystemStore("s3://kolo-no-such-bucket/x", storage_options=s3_server.storage_options)
    with pytest.raises(StoreError, match="bucket/container does not exist") as info:
        store.write_text(checkpoint_file(store, "r"), "x")
    assert "s3://kolo-no-such-bucket/x/runs/r/checkpoint" in str(info.value)


def test_wrong_azure_key_is_refused(azure_prefix):
    # Azurite checks shared-key signatures: a wrong (but well-formed) key must be refused.
    options = dict(azure_prefix.storage_options)
    options["azure_storage_account_key"] = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="
    store = FilesystemStore(azure_prefix.url, storage_options=options)
    with pytest.raises(StoreError, match="credentials") as info:
        store.write_text(checkpoint_file(store, "r"), "x")
    assert azure_prefix.url in str(info.value)


def test_unreachable_endpoint_fails_fast():
    options = {
        "aws_endpoint": "http://127.0.0.1:9",
        "aws_allow_http": "true",
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_region": "us-east-1",
    }
    store = FilesystemStore("s3://bucket/x", storage_options=options)
    started = time.monotonic()
    with pytest.raises(StoreError, match="endpoint"):
        store.read(checkpoint_file(store, "r"))
    assert time.monotonic() - started < 30


def test_native_calls_release_the_gil(s3_prefix):
    store = FilesystemStore(s3_prefix.url, storage_options=s3_prefix.storage_options)
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        started = time.monotonic()
        store.write_bytes(checkpoint_file(store, "r"), b"x" * (32 * 1024 * 1024))
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
    during = [t for t in ticks if started <= t <= started + elapsed]
    assert len(during) >= max(2, int(elapsed / 0.005 * 0.3)), (len(during), elapsed)


def test_native_store_reports_its_url(tmp_path):
    handle = _native.Store(str(tmp_path))
    assert handle.url == f"file://{tmp_path}"
    assert str(handle.local_path("a/b")) == str(tmp_path / "a" / "b")
    assert _native.resolve_store_url("s3a://b/p/") == "s3://b/p"
    assert os.fspath(tmp_path)


# -- Horovod's store API ------------------------------------------------------------------------

#: Every public method (with its positional parameters) and constant of Horovod 0.28.1's store
#: classes (horovod/spark/common/store.py), inherited ones included: 169 methods over 6 classes
#: plus 3 class constants = 172.
_STORE_BASE = {
    "create": ["prefix_path"],
    "exists": ["path"],
    "get_checkpoint_filename": [],
    "get_checkpoint_path": ["run_id"],
    "get_checkpoints": ["run_id", "suffix"],
    "get_local_output_dir_fn": ["run_id"],
    "get_logs_path": ["run_id"],
    "get_logs_subdir": [],
    "get_parquet_dataset": ["path"],
    "get_run_path": ["run_id"],
    "get_runs_path": [],
    "get_test_data_path": ["idx"],
    "get_train_data_path": ["idx"],
    "get_val_data_path": ["idx"],
    "is_parquet_dataset": ["path"],
    "read": ["path"],
    "saving_runs": [],
    "sync_fn": ["run_id"],
    "to_remote": ["run_id", "dataset_idx"],
    "write_text": ["path", "text"],
}
_ABSTRACT_FS = {
    **_STORE_BASE,
    "__init__": [
        "prefix_path",
        "train_path",
        "val_path",
        "test_path",
        "runs_path",
        "save_runs",
        "storage_options",
        "checkpoint_filename",
    ],
    "fs": None,  # a property
    "get_data_metadata_path": ["path"],
    "get_full_path": ["path"],
    "get_full_path_fn": [],
    "get_localized_path": ["path"],
    "read_serialized_keras_model": ["ckpt_path", "model", "custom_objects"],
}
_FILESYSTEM = {
    **_ABSTRACT_FS,
    "__init__": ["prefix_path"],
    "copy": ["lpath", "rpath", "recursive", "callback"],
    "get_filesystem": [],
    "matches": ["path"],
}
HOROVOD_STORE_API = {
    "Store": {**_STORE_BASE, "__init__": []},
    "AbstractFilesystemStore": _ABSTRACT_FS,
    "FilesystemStore": _FILESYSTEM,
    "LocalStore": {**_FILESYSTEM, "__init__": []},
    "HDFSStore": {
        **_ABSTRACT_FS,
        "__init__": ["prefix_path", "host", "port", "user", "kerb_ticket", "driver", "extra_conf"],
        "matches": ["path"],
        "parse_url": ["url"],
    },
    "DBFSLocalStore": {
        **_FILESYSTEM,
        "matches_dbfs": ["path"],
        "normalize_path": ["path"],
    },
}
HOROVOD_STORE_CONSTANTS = {
    "HDFSStore": ["FS_PREFIX", "URL_PATTERN"],
    "DBFSLocalStore": ["DBFS_PATH_FORMAT_ERROR"],
}


def test_every_horovod_store_method_with_its_parameters():
    import inspect

    checked = 0
    for class_name, methods in HOROVOD_STORE_API.items():
        cls = getattr(horovod_store, class_name)
        for name, params in methods.items():
            checked += 1
            assert hasattr(cls, name), f"{class_name}.{name} is missing"
            if params is None:
                assert isinstance(inspect.getattr_static(cls, name), property), name
                continue
            signature = inspect.signature(getattr(cls, name))
            positional = [
                p.name
                for p in signature.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name not in ("self", "cls")
            ]
            # Horovod's positional parameters, in its order; kolo may add optional ones after.
            assert positional[: len(params)] == params, f"{class_name}.{name}{signature}"
        for constant in HOROVOD_STORE_CONSTANTS.get(class_name, []):
            checked += 1
            assert isinstance(getattr(cls, constant), str), f"{class_name}.{constant}"
    assert checked == 172


def test_horovod_store_methods_work_on_a_local_store(tmp_path, dbfs_mount):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = Store.create(str(tmp_path / "exp"))
    assert store.protocol is None
    data = store.get_train_data_path(0)
    table = pa.table({"x": [1.0, 2.0, 3.0], "y": [0, 1, 0]})
    os.makedirs(data)
    pq.write_table(table, os.path.join(data, "part-0.parquet"))
    assert store.get_parquet_dataset(data).read().equals(table)
    assert store.get_parquet_dataset("file://" + data).read().num_rows == 3

    # fs: fsspec's interface on the localized paths, as Horovod's store.fs.
    fs = store.get_filesystem()
    assert fs is store.fs and fs.exists(store.get_localized_path(data))
    assert store.get_localized_path("file://" + data) == data
    with fs.open(os.path.join(data, "part-0.parquet"), "rb") as f:
        assert f.read(4) == b"PAR1"

    # copy: the contents of a local directory into the run path (atomic writes).
    local = tmp_path / "out"
    (local / "logs").mkdir(parents=True)
    (local / "checkpoint").write_bytes(b"weights")
    (local / "logs" / "events").write_text("e")
    store.copy(str(local), store.get_run_path("r"), recursive=True)
    assert store.read(store.get_run_path("r") + "/checkpoint") == b"weights"
    assert store.read(store.get_logs_path("r") + "/events") == b"e"
    with pytest.raises(ValueError, match="recursive=True"):
        store.copy(str(local), store.get_run_path("r"))

    # get_checkpoints: the files directly in the run directory with the suffix (Horovod's ls).
    run = store.get_run_path("r")
    for name in ("epoch=1.ckpt", "epoch=0.ckpt", "sub/nested.ckpt", "notes.txt"):
        store.write_text(f"{run}/{name}", "x")
    assert store.get_checkpoints("r") == [f"{run}/epoch=0.ckpt", f"{run}/epoch=1.ckpt"]
    assert store.get_checkpoints("r", suffix=".txt") == [f"{run}/notes.txt"]

    metadata = store.get_data_metadata_path(data + "/")
    assert metadata.startswith(data + "_") and metadata.endswith("_cached_metadata.pkl")

    hdfs = HDFSStore("hdfs://nn:8020/user/me/exp")
    assert hdfs.parse_url("hdfs://nn:8020/user/me") == ("hdfs://", "nn", 8020, "/user/me", 14)
    assert hdfs.parse_url("/user/me") == (None, None, None, "/user/me", 0)
    # Horovod's positional order: the 8th argument goes on to train_path.
    positional = HDFSStore("/user/me/exp", "nn", 8020, "me", None, "libhdfs", None, "/t")
    assert positional.get_train_data_path() == "hdfs:///t"

    assert DBFSLocalStore.normalize_path("file:/dbfs/a") == "/dbfs/a"
    with pytest.raises(ValueError, match="not a DBFS path"):
        DBFSLocalStore.normalize_path("/tmp/a")
    assert Store.create("dbfs:/ml/x").get_localized_path("dbfs:/ml/x/y") == "/dbfs/ml/x/y"


def test_horovod_store_fs_and_parquet_dataset_on_s3(s3_prefix):
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = Store.create(s3_prefix.url, storage_options=s3_prefix.storage_options)
    assert store.protocol == "s3"
    data = store.get_train_data_path(1)
    buffer = pa.BufferOutputStream()
    table = pa.table({"v": list(range(10))})
    pq.write_table(table, buffer)
    store.write_bytes(data + "/part-0.parquet", buffer.getvalue().to_pybytes())
    assert store.get_parquet_dataset(data).read().equals(table)
    localized = store.get_localized_path(data)
    assert localized == data.removeprefix("s3://")
    assert [p.rsplit("/", 1)[-1] for p in store.fs.ls(localized)] == ["part-0.parquet"]


def test_read_serialized_keras_model(tmp_path):
    import base64

    keras = pytest.importorskip("keras")
    import numpy as np

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    saved = tmp_path / "m.keras"
    model.save(saved)
    store = Store.create(str(tmp_path / "exp"))
    checkpoint = store.get_run_path("r") + "/checkpoint.keras"
    store.write_bytes(checkpoint, saved.read_bytes())
    encoded = store.read_serialized_keras_model(checkpoint, model, custom_objects={})
    restored_path = tmp_path / "restored.keras"
    restored_path.write_bytes(base64.b64decode(encoded))
    restored = keras.models.load_model(restored_path)
    x = np.ones((1, 3), dtype="float32")
    np.testing.assert_allclose(restored.predict(x, verbose=0), model.predict(x, verbose=0))


def test_checkpoint_path_is_the_run_directory_as_in_horovod(tmp_path):
    # Horovod's estimators join the file name themselves:
    # os.path.join(store.get_checkpoint_path(run_id), store.get_checkpoint_filename()).
    store = Store.create(str(tmp_path), checkpoint_filename="model.ckpt")
    joined = os.path.join(store.get_checkpoint_path("r"), store.get_checkpoint_filename())
    assert joined == checkpoint_file(store, "r") == f"{tmp_path}/runs/r/model.ckpt"
    store.write_bytes(joined, b"weights")
    assert store.get_checkpoints("r", suffix=".ckpt") == [joined]


def test_bare_store_says_it_needs_a_prefix_path():
    # Horovod's Store() is abstract; kolo's is concrete and says what to give.
    with pytest.raises(TypeError, match=r"Store needs a prefix_path.*Store\.create") as info:
        Store()
    assert isinstance(info.value, KoloError)


BAD_RUN_IDS = ["..", "../x", "a/../../b", "/abs", "a\0b", ""]


def test_run_ids_that_could_leave_the_runs_directory_are_refused(tmp_path):
    from kolo.estimator.training import train_on_ranks

    root = tmp_path / "store"
    store = FilesystemStore(str(root))
    store.write_text(store.get_run_path("keep") + "/checkpoint", "mine")
    sentinel = tmp_path / "x"
    sentinel.write_text("outside the store")
    (root / "x").mkdir()
    (root / "x" / "keep").write_text("runs/../x")
    for run_id in BAD_RUN_IDS:
        for method in (
            store.get_run_path,
            store.get_checkpoint_path,
            store.get_logs_path,
            store.get_checkpoints,
            store.sync_fn,
            store.get_local_output_dir_fn,
            store.to_remote,
        ):
            with pytest.raises(StoreError, match="run_id") as caught:
                method(run_id)
            named = 'run_id "' + run_id.replace("\0", "\\0") + '"'
            assert named in str(caught.value), (method, str(caught.value))
        # What a run's clean-up would do with that id: nothing, the id never becomes a path.
        with pytest.raises(StoreError):
            store.delete(store.get_run_path(run_id))
        with pytest.raises(StoreError, match="run_id"):
            train_on_ranks(
                None,
                lambda _: None,
                lambda *_: [],
                ranks=1,
                ranks_param="num_proc",
                batch_size=1,
                run_id=run_id,
                verbose=0,
                epochs=1,
            )
    assert sentinel.read_text() == "outside the store"
    assert (root / "x" / "keep").read_text() == "runs/../x"
    assert store.read_text(store.get_run_path("keep") + "/checkpoint") == "mine"


def test_store_paths_with_dot_dot_nul_or_nothing_are_refused(tmp_path):
    root = tmp_path / "a" / "store"
    store = FilesystemStore(str(root))
    store.write_text(store.get_run_path("r1") + "/checkpoint", "c")
    (tmp_path / "a" / "outside").mkdir()
    sentinel = tmp_path / "a" / "outside" / "keep"
    sentinel.write_text("sentinel")
    escaping = [
        store.get_runs_path() + "/../../outside",
        str(root) + "/../outside",
        f"file://{root}/runs/r1/../../../outside",
        str(root) + "/runs/r1\0/x",
        "",
    ]
    for path in escaping:
        for call in (
            store.delete,
            store.exists,
            store.read,
            store.list,
            store.is_parquet_dataset,
            lambda p: store.write_bytes(p, b"x"),
        ):
            with pytest.raises(StoreError, match="refused") as caught:
                call(path)
            assert "is refused" in str(caught.value)
    assert sentinel.read_text() == "sentinel"
    assert store.read_text(store.get_run_path("r1") + "/checkpoint") == "c"
    # The native store refuses the same keys itself.
    handle = _native.Store(str(root))
    for key in ["..", "../outside", "runs/../../outside", "/abs", "a\0b"]:
        with pytest.raises(StoreError, match="refused"):
            handle.delete(key)
        with pytest.raises(StoreError, match="refused"):
            handle.local_path(key)
    assert sentinel.read_text() == "sentinel"


KILLED_WRITER = """
import sys
from kolo.store import FilesystemStore
FilesystemStore(sys.argv[1]).write_bytes(sys.argv[1] + "/runs/r1/checkpoint", bytes(1 << 30))
"""


def _staging_files(directory: Path) -> list[Path]:
    return [p for p in directory.glob("*#*") if p.name.rsplit("#", 1)[1].isdigit()]


def test_a_killed_writers_temporary_file_is_reclaimed_by_the_next_write(tmp_path):
    root = tmp_path / "store"
    run_dir = root / "runs" / "r1"
    leftover: list[Path] = []
    for _attempt in range(3):
        writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(root)])
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and writer.poll() is None:
                staged = _staging_files(run_dir) if run_dir.exists() else []
                if staged and staged[0].stat().st_size > 0:
                    writer.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.001)
        finally:
            writer.kill()
            writer.wait(timeout=30)
        leftover = _staging_files(run_dir)
        if leftover and not (run_dir / "checkpoint").exists():
            break
    assert leftover, "the writer finished before it could be killed three times"
    assert not (run_dir / "checkpoint").exists()
    store = FilesystemStore(str(root))
    # Listings never show it; a write soon after leaves it (its writer might still be alive).
    assert store.list(store.get_run_path("r1")) == []
    store.write_text(store.get_run_path("r1") + "/other", "x")
    assert all(path.exists() for path in leftover)
    # Untouched for longer than the 15 minutes a live writer never pauses: reclaimed by the
    # next write into the same directory.
    hour_ago = time.time() - 3600
    for path in leftover:
        os.utime(path, (hour_ago, hour_ago))
    store.write_text(store.get_run_path("r1") + "/checkpoint", "complete")
    assert _staging_files(run_dir) == []
    assert store.read_text(store.get_run_path("r1") + "/checkpoint") == "complete"


def test_a_prepared_dataset_without_its_success_marker_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kolo.estimator.dataset import get_dataset_metadata
    from kolo.exceptions import DataError

    store = FilesystemStore(str(tmp_path))
    train = Path(store.get_train_data_path(0))
    train.mkdir(parents=True)
    table = pa.table({"x": [float(i) for i in range(64)], "y": list(range(64))})
    pq.write_table(table, train / "part-00000.parquet")
    with pytest.raises(DataError, match="_SUCCESS") as caught:
        get_dataset_metadata(store, 0, ["x", "y"])
    assert "did not finish" in str(caught.value) and "re-run" in str(caught.value)
    (train / "_SUCCESS").write_bytes(b"")
    assert get_dataset_metadata(store, 0, ["x", "y"]).train_rows == 64
    # A validation side without its marker is refused the same way.
    val = Path(store.get_val_data_path(0))
    val.mkdir(parents=True)
    pq.write_table(table, val / "part-00000.parquet")
    with pytest.raises(DataError, match="_SUCCESS"):
        get_dataset_metadata(store, 0, ["x", "y"])
