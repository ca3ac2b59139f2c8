"""Where a training job keeps its data and runs: a local directory, a Databricks ``/dbfs`` path,
or a prefix in S3, GCS, Azure or HDFS.

The classes carry Horovod's names and constructor arguments (``Store.create``,
``FilesystemStore``/``LocalStore``, ``HDFSStore``, ``DBFSLocalStore``) and its run layout::

    <prefix>/intermediate_train_data.<idx>   prepared training data
    <prefix>/intermediate_val_data.<idx>     prepared validation data
    <prefix>/runs/<run_id>/                  the run (get_checkpoint_path, as Horovod's)
    <prefix>/runs/<run_id>/checkpoint        its checkpoint file (get_checkpoint_filename)
    <prefix>/runs/<run_id>/logs/             the run's logs

Methods take full paths as the ``get_*_path`` methods return them. The work is done by the Rust
core (kolo-store over ``object_store``) with the GIL released; every failure raises
:class:`kolo.exceptions.StoreError` naming the URL and the fix. Stores pickle as their
constructor arguments and rebuild their client lazily, so they travel to Spark executors and Ray
actors.

Example::

    from kolo.store import Store

    store = Store.create("s3://bucket/experiments", storage_options={
        "aws_endpoint": "http://127.0.0.1:9000", "aws_allow_http": "true"})
    store.write_text(store.get_run_path("run_1") + "/state.json", '{"epoch": 3}')
    print(store.exists(store.get_run_path("run_1")))        # True
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional
from urllib.parse import unquote, urlsplit

from kolo import _native, _store_filesystem
from kolo.exceptions import InvalidValueError, MissingArgumentError, StoreError

__all__ = [
    "AbstractFilesystemStore",
    "DBFSLocalStore",
    "FilesystemStore",
    "HDFSStore",
    "LocalStore",
    "Store",
    "SyncReport",
    "check_run_id",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


@dataclass(frozen=True)
class SyncReport:
    """What one call of a ``sync_fn`` function did (names relative to the local directory)."""

    uploaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0


def _option_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float, os.PathLike)):
        return str(os.fspath(value) if isinstance(value, os.PathLike) else value)
    raise StoreError(
        f"storage option {key!r} has a {type(value).__name__} value; kolo takes flat "
        "object_store keys with string values (e.g. aws_endpoint, aws_access_key_id), not "
        "fsspec's nested client_kwargs: see docs/store.md"
    )


def _flat_options(storage_options: Optional[dict]) -> dict[str, str]:
    return {str(k): _option_value(str(k), v) for k, v in (storage_options or {}).items()}


def _join(base: str, *names: str) -> str:
    out = base.rstrip("/")
    for name in names:
        out = f"{out}/{name.strip('/')}"
    return out


def _check_path(path: str) -> str:
    """``path`` when no store operation on it can reach another place than it names: not
    empty, no NUL byte, no ``..`` component (``/data/store/runs/../../etc`` would leave the
    store). :class:`~kolo.exceptions.StoreError` naming the path and the rule otherwise."""
    rule = None
    if not path:
        rule = "it is empty"
    elif "\0" in path:
        rule = "it contains a NUL byte"
    elif ".." in path.split("/"):
        rule = "it has a `..` component, which would leave the directory it names"
    if rule is not None:
        raise StoreError(
            f"store path {path!r} is refused: {rule}; give the full path without `..` "
            "(e.g. store.get_run_path(run_id) + '/checkpoint')"
        )
    return path


def check_run_id(run_id: str) -> str:
    """``run_id`` when it is one plain name (``runs/<run_id>`` names its directory): not
    empty, not ``.``/``..``, no ``/``, NUL or control characters, at most 255 bytes;
    :class:`~kolo.exceptions.StoreError` naming the id and the rule otherwise.

    Example::

        check_run_id("run_1")       # 'run_1'
        check_run_id("../x")        # raises StoreError
    """
    if not isinstance(run_id, str):
        raise StoreError(f"run_id must be a string, not {type(run_id).__name__} ({run_id!r})")
    _native.check_run_id(run_id)
    return run_id


def _rebuild(cls: type, args: tuple, kwargs: dict) -> Store:
    return cls(*args, **kwargs)


class Store:
    """A store prefix and Horovod's layout under it; also usable directly for any URL.

    ``Store.create(prefix_path, ...)`` picks the class the way Horovod does: ``hdfs://`` →
    :class:`HDFSStore`, ``dbfs:/``, ``/dbfs/``, ``file:///dbfs/`` → :class:`DBFSLocalStore`,
    anything else → :class:`FilesystemStore`.

    Args:
        prefix_path: a local path, ``file://``, ``s3://``, ``gs://``, ``az://``, ``abfs[s]://``,
            ``hdfs://`` URL or a DBFS path.
        train_path: overrides the default location of the training data.
        val_path: overrides the default location of the validation data.
        test_path: overrides the default location of the test data.
        runs_path: overrides the default location of the runs (checkpoints, logs).
        save_runs: whether runs (checkpoints, logs) are kept; when False the checkpoint and logs
            paths are None.
        storage_options: object_store options (``aws_access_key_id``, ``aws_endpoint``,
            ``google_service_account``, ``azure_storage_account_name``, ``timeout``, ...);
            environment variables (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) fill the rest.
        checkpoint_filename: the checkpoint's file name (default ``checkpoint``).

    Example::

        store = Store("/tmp/experiments")
        store.get_train_data_path(0)       # '/tmp/experiments/intermediate_train_data.0'
    """

    def __init__(
        self,
        prefix_path: Optional[str] = None,
        train_path: Optional[str] = None,
        val_path: Optional[str] = None,
        test_path: Optional[str] = None,
        runs_path: Optional[str] = None,
        save_runs: bool = True,
        storage_options: Optional[dict] = None,
        checkpoint_filename: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        if prefix_path is None:
            # Horovod's Store() is an abstract base whose methods all raise; kolo's is a
            # working store, so it needs its location.
            raise MissingArgumentError(
                f"{type(self).__name__} needs a prefix_path: kolo's stores are concrete, e.g. "
                f"Store.create('/tmp/exp') or {type(self).__name__}('s3://bucket/exp') "
                "(Horovod's abstract Store() has no kolo counterpart: see docs/store.md)"
            )
        self._init_args = (prefix_path,)
        self._init_kwargs = dict(
            train_path=train_path,
            val_path=val_path,
            test_path=test_path,
            runs_path=runs_path,
            save_runs=save_runs,
            storage_options=storage_options,
            checkpoint_filename=checkpoint_filename,
            **kwargs,
        )
        self.storage_options = storage_options
        prefix_path = str(os.fspath(prefix_path))
        if not prefix_path.strip():
            # Resolving the empty location raises StoreError with the fix.
            _native.resolve_store_url(prefix_path)
        self.prefix_path = self.get_full_path(prefix_path).rstrip("/") or "/"
        self._train_path = self._full_or_default(train_path, "intermediate_train_data")
        self._val_path = self._full_or_default(val_path, "intermediate_val_data")
        self._test_path = self._full_or_default(test_path, "intermediate_test_data")
        self._runs_path = self._full_or_default(runs_path, "runs")
        self._save_runs = save_runs
        self.checkpoint_filename = checkpoint_filename or self._default_checkpoint_filename()
        self._handle: Optional[_native.Store] = None
        self._fs: Any = None
        self._options = _flat_options(storage_options)
        # Resolve now so a bad location fails at construction, not on the first call.
        self._base_url = _native.resolve_store_url(self._native_location(self.prefix_path))

    # -- construction, pickling ---------------------------------------------------------------

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> Store:
        """The store class for ``prefix_path``, as Horovod's ``Store.create`` picks it.

        Example::

            Store.create("hdfs://nn:8020/user/me/exp")   # HDFSStore
            Store.create("dbfs:/ml/exp")                 # DBFSLocalStore
            Store.create("s3://bucket/exp")              # FilesystemStore
        """
        if HDFSStore.matches(prefix_path):
            return HDFSStore(prefix_path, *args, **kwargs)
        if DBFSLocalStore.matches(prefix_path):
            return DBFSLocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    def __reduce__(self):
        return (_rebuild, (type(self), self._init_args, self._init_kwargs))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.prefix_path!r})"

    @property
    def _native(self) -> _native.Store:
        """The native handle, built on first use (after unpickling, in the new process)."""
        if self._handle is None:
            self._handle = self._open(self.prefix_path)
        return self._handle

    def _open(self, full_path: str) -> _native.Store:
        self._prepare_environment()
        return _native.Store(self._native_location(full_path), self._native_options())

    def _prepare_environment(self) -> None:
        """Sets what the native client reads from the environment (HDFS user, Kerberos)."""

    def _native_options(self) -> dict[str, str]:
        return self._options

    def native_location(self) -> tuple[str, dict[str, str]]:
        """The location and flat options that open this store's prefix in kolo's Rust core
        (what ``kolo.data`` passes on): HDFS ``host``/``port``/``extra_conf`` folded in.

        Example::

            HDFSStore("/user/me/exp", host="nn", port=8020).native_location()
            # ('hdfs://nn:8020/user/me/exp', {})
        """
        return self._native_location(self.prefix_path), dict(self._native_options())

    def _native_location(self, full_path: str) -> str:
        """The location the native store opens for ``full_path`` (subclasses map their forms)."""
        return full_path

    def _default_checkpoint_filename(self) -> str:
        return "checkpoint"

    # -- Horovod's layout -------------------------------------------------------------------------

    def _full_or_default(self, path: Optional[str], default_key: str) -> str:
        if path is not None:
            return self.get_full_path(str(os.fspath(path)))
        return _join(self.prefix_path, default_key)

    def get_train_data_path(self, idx: Optional[Any] = None) -> str:
        """``<prefix>/intermediate_train_data[.<idx>]``."""
        return f"{self._train_path}.{idx}" if idx is not None else self._train_path

    def get_val_data_path(self, idx: Optional[Any] = None) -> str:
        """``<prefix>/intermediate_val_data[.<idx>]``."""
        return f"{self._val_path}.{idx}" if idx is not None else self._val_path

    def get_test_data_path(self, idx: Optional[Any] = None) -> str:
        """``<prefix>/intermediate_test_data[.<idx>]``."""
        return f"{self._test_path}.{idx}" if idx is not None else self._test_path

    def saving_runs(self) -> bool:
        """Whether checkpoints and logs are kept."""
        return self._save_runs

    def get_runs_path(self) -> str:
        """``<prefix>/runs``."""
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        """``<prefix>/runs/<run_id>``; :class:`~kolo.exceptions.StoreError` unless ``run_id``
        is one plain name (:func:`check_run_id`)."""
        return _join(self.get_runs_path(), check_run_id(run_id))

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        """Where the run's checkpoint file(s) go: the run directory ``<prefix>/runs/<run_id>``,
        as Horovod's; None when not saving runs. The checkpoint file is this joined with
        :meth:`get_checkpoint_filename`.

        Example::

            ckpt = store.get_checkpoint_path("run_1") + "/" + store.get_checkpoint_filename()
        """
        if not self._save_runs:
            return None
        return self.get_run_path(run_id)

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> list[str]:
        """The full paths of the files directly in the run directory that end with
        ``suffix``, sorted (Horovod's); empty when not saving runs.

        Example::

            store.get_checkpoints("run_1")     # ['/tmp/exp/runs/run_1/epoch=2.ckpt']
        """
        if not self._save_runs:
            return []
        run_path = self.get_run_path(run_id)
        return [
            p
            for p in self.list(run_path)
            if p.endswith(suffix) and "/" not in p[len(run_path) + 1 :]
        ]

    def get_logs_path(self, run_id: str) -> Optional[str]:
        """``<prefix>/runs/<run_id>/logs``, or None when not saving runs."""
        if not self._save_runs:
            return None
        return _join(self.get_run_path(run_id), self.get_logs_subdir())

    def get_checkpoint_filename(self) -> str:
        """The checkpoint's file name (``checkpoint`` unless given)."""
        return self.checkpoint_filename

    def get_logs_subdir(self) -> str:
        """``logs``."""
        return "logs"

    # -- paths --------------------------------------------------------------------------------

    @classmethod
    def matches(cls, path: str) -> bool:
        """Whether this class handles ``path`` (the base class handles every location)."""
        return True

    def path_prefix(self) -> str:
        """What :meth:`get_full_path` puts before a path that lacks it (nothing here)."""
        return ""

    def get_full_path(self, path: str) -> str:
        """``path`` with the filesystem prefix it may lack (Horovod's ``get_full_path``)."""
        return path

    def get_localized_path(self, path: str) -> str:
        """``path`` without its URL scheme and authority (Horovod's ``get_localized_path``)."""
        match = re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://[^/]*", path)
        return path[match.end() :] if match else path

    def get_full_path_fn(self) -> Callable[[str], str]:
        """A picklable function mapping a localized path to a full one."""
        return _FullPath(self.path_prefix())

    def _locate(self, path: str) -> tuple[_native.Store, str]:
        """The native store and store-relative key for a full path or URL (refused as
        :func:`_check_path` says)."""
        path = self.get_full_path(_check_path(str(os.fspath(path))))
        prefix = self.prefix_path.rstrip("/")
        if path.rstrip("/") == prefix:
            return self._native, ""
        if path.startswith(prefix + "/"):
            return self._native, path[len(prefix) + 1 :]
        canonical = _native.resolve_store_url(self._native_location(path))
        if canonical == self._base_url:
            return self._native, ""
        if canonical.startswith(self._base_url + "/"):
            return self._native, canonical[len(self._base_url) + 1 :]
        # Outside the prefix: a store opened at that location, with the same options.
        return self._open(path), ""

    # -- data ---------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether ``path`` is an object or a non-empty directory (locally: any file or dir).

        Example::

            store.exists(store.get_run_path("run_1") + "/checkpoint")
        """
        handle, rel = self._locate(path)
        return handle.exists(rel)

    def read(self, path: str) -> bytes:
        """The whole object at ``path``; StoreError when there is none.

        Example::

            state = store.read(store.get_run_path("run_1") + "/checkpoint")
        """
        handle, rel = self._locate(path)
        return handle.get(rel)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The object at ``path`` decoded as text."""
        return self.read(path).decode(encoding)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Writes ``data`` at ``path`` atomically: readers see the old or the whole new object.

        Example::

            store.write_bytes(store.get_run_path("run_1") + "/checkpoint", torch_bytes)
        """
        handle, rel = self._locate(path)
        handle.put(rel, bytes(data) if not isinstance(data, (bytes, bytearray)) else data)

    def write_text(self, path: str, text: str, encoding: str = "utf-8") -> None:
        """Writes ``text`` at ``path`` atomically.

        Example::

            store.write_text(store.get_run_path("run_1") + "/params.json", "{}")
        """
        self.write_bytes(path, text.encode(encoding))

    def list(self, path: Optional[str] = None) -> list[str]:
        """Full paths of every object under ``path`` (default: the prefix), sorted.

        Example::

            store.list(store.get_logs_path("run_1"))
        """
        handle, rel = self._locate(self.prefix_path if path is None else path)
        base = self.prefix_path if handle is self._handle else self.get_full_path(path or "")
        return [_join(base, key) for key, _size, _etag, _mtime in handle.list(rel)]

    def delete(self, path: str) -> None:
        """Deletes the object at ``path`` and everything under it; missing is not an error.

        Example::

            store.delete(store.get_run_path("old_run"))
        """
        handle, rel = self._locate(path)
        handle.delete(rel)

    def is_parquet_dataset(self, path: str) -> bool:
        """Whether ``path`` is a Parquet file or a directory holding ``*.parquet`` files.

        Example::

            store.is_parquet_dataset(store.get_train_data_path(0))
        """
        handle, rel = self._locate(path)
        try:
            listed = handle.list(rel)
        except StoreError:
            return False
        if not listed:
            return rel.endswith(".parquet") and handle.exists(rel)
        return any(
            key.endswith(".parquet") and not key.rsplit("/", 1)[-1].startswith(("_", "."))
            for key, _size, _etag, _mtime in listed
        )

    def get_parquet_dataset(self, path: str) -> Any:
        """A ``pyarrow.parquet.ParquetDataset`` of the Parquet data at ``path`` (Horovod's;
        needs pyarrow).

        Example::

            table = store.get_parquet_dataset(store.get_train_data_path(0)).read()
        """
        import pyarrow.parquet as pq

        arrow_fs, arrow_path = self._arrow_location(path)
        return pq.ParquetDataset(arrow_path, filesystem=arrow_fs)

    def get_data_metadata_path(self, path: str) -> str:
        """Where Horovod caches a dataset's metadata: ``<localized path>_<host hash>_cached_
        metadata.pkl``.

        Example::

            store.get_data_metadata_path(store.get_train_data_path(0))
        """
        localized = self.get_localized_path(path).rstrip("/")
        return f"{localized}_{_store_filesystem.host_hash()}_cached_metadata.pkl"

    @property
    def fs(self) -> Any:
        """An fsspec filesystem over this store's location (Horovod's ``store.fs``: ``open``,
        ``exists``, ``ls``, ``put_file``...; paths as :meth:`get_localized_path` gives them;
        needs pyarrow and fsspec). kolo's own methods do not go through it.

        Example::

            with store.fs.open(store.get_localized_path(path), "rb") as f:
                data = f.read()
        """
        if self._fs is None:
            self._fs = _store_filesystem.fsspec_filesystem(
                self._arrow_location(self.prefix_path)[0]
            )
        return self._fs

    def get_filesystem(self) -> Any:
        """:attr:`fs` (Horovod's ``FilesystemStore.get_filesystem``).

        Example::

            fs = store.get_filesystem()
        """
        return self.fs

    def _arrow_filesystem_settings(self) -> Optional[dict]:
        """HDFS connection settings for pyarrow (None for other stores)."""
        return None

    def _arrow_location(self, path: str) -> tuple[Any, str]:
        """The pyarrow filesystem and the path within it for a full path or URL."""
        full = self.get_full_path(_check_path(str(os.fspath(path))))
        url = _native.resolve_store_url(self._native_location(full))
        parts = urlsplit(url)
        arrow_fs = _store_filesystem.arrow_filesystem(
            url, self._native_options(), self._arrow_filesystem_settings()
        )
        if parts.scheme == "file":
            return arrow_fs, unquote(parts.path)
        if parts.scheme == "hdfs":
            return arrow_fs, unquote(parts.path)
        return arrow_fs, parts.netloc + unquote(parts.path)

    def read_serialized_keras_model(self, ckpt_path: str, model: Any, custom_objects: Any) -> str:
        """The Keras model saved at ``ckpt_path``, loaded (within ``custom_objects``) and
        returned serialized as base64 text, as Horovod's store does (``model`` is used only
        when the checkpoint holds weights alone).

        Example::

            encoded = store.read_serialized_keras_model(
                store.get_run_path(run_id) + "/checkpoint.keras", model, custom_objects={})
        """
        import base64

        import keras

        data = self.read(ckpt_path)
        suffix = os.path.splitext(ckpt_path)[1] or ".keras"
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "checkpoint" + suffix)
            with open(source, "wb") as f:
                f.write(data)
            with keras.utils.custom_object_scope(custom_objects or {}):
                if source.endswith(".weights.h5"):
                    model.load_weights(source)
                    loaded = model
                else:
                    loaded = keras.models.load_model(source)
            target = os.path.join(tmp, "model.keras")
            loaded.save(target)
            with open(target, "rb") as f:
                return base64.b64encode(f.read()).decode("ascii")

    # -- runs ---------------------------------------------------------------------------------

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        """A context manager factory yielding a temporary local directory for a run's output."""
        check_run_id(run_id)
        return _TempDir(None)

    def sync_fn(self, run_id: str) -> Callable[[str], SyncReport]:
        """A function ``fn(local_dir)`` that uploads the changed files of ``local_dir`` to the
        run path (as Horovod's ``sync_fn``); picklable.

        Example::

            sync = store.sync_fn("run_1")
            with store.get_local_output_dir_fn("run_1")() as local_dir:
                ...  # write checkpoints and logs into local_dir
                sync(local_dir)
        """
        return _Sync(self, self.get_run_path(run_id))

    def to_remote(self, run_id: str, dataset_idx: Optional[Any] = None) -> Any:
        """An object with the paths and functions a training process needs (Horovod's)."""
        attrs = {
            "train_data_path": self.get_train_data_path(dataset_idx),
            "val_data_path": self.get_val_data_path(dataset_idx),
            "test_data_path": self.get_test_data_path(dataset_idx),
            "saving_runs": self.saving_runs(),
            "runs_path": self.get_runs_path(),
            "run_path": self.get_run_path(run_id),
            "checkpoint_path": self.get_checkpoint_path(run_id),
            "logs_path": self.get_logs_path(run_id),
            "checkpoint_filename": self.get_checkpoint_filename(),
            "logs_subdir": self.get_logs_subdir(),
            "get_full_path": self.get_full_path_fn(),
            "get_local_output_dir": self.get_local_output_dir_fn(run_id),
            "sync": self.sync_fn(run_id),
            "store": self,
        }
        return _RemoteStore(attrs)


class _RemoteStore:
    def __init__(self, attrs: dict) -> None:
        self.__dict__.update(attrs)


class _FullPath:
    """Picklable ``get_full_path`` function."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, path: str) -> str:
        return path if not self.prefix or path.startswith(self.prefix) else self.prefix + path


class _TempDir:
    """Picklable factory of temporary local directories (removed on exit)."""

    def __init__(self, temp_dir: Optional[str]) -> None:
        self.temp_dir = temp_dir

    @contextlib.contextmanager
    def __call__(self) -> Iterator[str]:
        path = tempfile.mkdtemp(dir=self.temp_dir)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


class _Sync:
    """Picklable ``sync_fn`` result: uploads changed files of a local dir to one run path."""

    def __init__(self, store: Store, run_path: str) -> None:
        self.store = store
        self.run_path = run_path

    def __call__(self, local_dir: str) -> SyncReport:
        handle, rel = self.store._locate(self.run_path)
        uploaded, unchanged, size = handle.sync_dir(os.fspath(local_dir), rel)
        return SyncReport(uploaded, unchanged, size)


class AbstractFilesystemStore(Store):
    """Horovod's base of the filesystem stores; kept for ``isinstance`` checks."""


class FilesystemStore(AbstractFilesystemStore):
    """A store on a local path or in S3, GCS or Azure (Horovod's fsspec-backed store).

    Example::

        store = FilesystemStore("gs://bucket/exp",
                                storage_options={"google_service_account": "/path/key.json"})
    """

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(prefix_path, *args, **kwargs)
        #: The URL scheme of the prefix (``s3``, ``gs``, ``file``...), None for a plain path.
        self.protocol = prefix_path.split("://", 1)[0] if "://" in str(prefix_path) else None

    def get_localized_path(self, path: str) -> str:
        """``path`` without its ``scheme://`` (Horovod's: ``s3://bucket/k`` → ``bucket/k``,
        ``file:///tmp/x`` → ``/tmp/x``), the form :attr:`fs` takes."""
        return path.split("://", 1)[1] if "://" in path else path

    def copy(
        self,
        lpath: str,
        rpath: str,
        recursive: bool = False,
        callback: Any = None,
        **kwargs: Any,
    ) -> None:
        """Copies the local file ``lpath``, or with ``recursive`` the files under the local
        directory ``lpath``, to ``rpath`` (the directory's contents go into ``rpath``, not a
        copy of the directory itself, as Horovod's ``copy``). ``callback`` is an fsspec
        callback (``set_size``/``relative_update``); other keyword arguments are accepted
        for Horovod compatibility (each file is written atomically).

        Example::

            store.copy("/tmp/run_output", store.get_run_path("run_1"), recursive=True)
        """
        lpath = os.fspath(lpath)
        if os.path.isdir(lpath):
            if not recursive:
                raise InvalidValueError(
                    f"{lpath} is a directory: pass recursive=True to copy what it holds"
                )
            pairs = [
                (os.path.join(root, name), os.path.relpath(os.path.join(root, name), lpath))
                for root, _dirs, files in os.walk(lpath)
                for name in sorted(files)
            ]
        else:
            pairs = [(lpath, None)]
        if callback is not None:
            callback.set_size(len(pairs))
        for source, relative in pairs:
            target = rpath if relative is None else _join(rpath, relative.replace(os.sep, "/"))
            with open(source, "rb") as f:
                self.write_bytes(target, f.read())
            if callback is not None:
                callback.relative_update(1)


class LocalStore(FilesystemStore):
    """Horovod's deprecated name of :class:`FilesystemStore` for local paths."""


class HDFSStore(AbstractFilesystemStore):
    """A store in HDFS, through the native HDFS client (no libhdfs or JVM needed).

    ``prefix_path`` is ``hdfs://namenode:8020/user/me/exp``, ``hdfs:///user/me/exp`` (namenode
    from ``fs.defaultFS`` in ``$HADOOP_CONF_DIR``) or ``/user/me/exp``. ``host``/``port``
    name the namenode when the URL does not; ``user`` sets ``HADOOP_USER_NAME`` and
    ``kerb_ticket`` sets ``KRB5CCNAME`` for this process; ``extra_conf`` is Hadoop configuration
    (``dfs.*`` keys); ``driver`` is accepted for compatibility and ignored; ``temp_dir`` is where
    local run output is staged.

    Example::

        store = HDFSStore("/user/me/exp", host="namenode", port=8020, user="me")
    """

    FS_PREFIX = "hdfs://"
    URL_PATTERN = "^(?:(.+://))?(?:([^/:]+))?(?:[:]([0-9]+))?(?:(.+))?$"
    URL_PREFIX_REGEX = re.compile(r"^(\w+)://([^/:]*)?(?::(\d+))?")

    def __init__(
        self,
        prefix_path: str,
        host: Optional[str] = None,
        port: Optional[int] = None,
        user: Optional[str] = None,
        kerb_ticket: Optional[str] = None,
        driver: str = "libhdfs",
        extra_conf: Optional[dict] = None,
        *args: Any,
        temp_dir: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        prefix_path = str(os.fspath(prefix_path))
        match = self.URL_PREFIX_REGEX.match(prefix_path)
        if match:
            if match.group(1) != "hdfs":
                raise StoreError(
                    f"HDFSStore got {prefix_path!r}, which is not an hdfs:// URL; use "
                    "Store.create() to pick the store class from the URL"
                )
            url_host, url_port = match.group(2) or None, match.group(3)
            path = prefix_path[match.end() :]
            self._url_prefix = prefix_path[: match.end()]
        else:
            url_host, url_port, path = None, None, prefix_path
            self._url_prefix = self.FS_PREFIX
        if not path.startswith("/"):
            raise StoreError(
                f'HDFS path must start with "/" (absolute): {prefix_path!r}; write '
                "hdfs://namenode:port/abs/path or /abs/path"
            )
        self._host = host or url_host
        self._port = int(port or url_port or 0) or None
        if self._host in (None, "default"):
            self._authority = ""
        else:
            self._authority = f"{self._host}:{self._port or 8020}"
        self._user = user
        self._kerb_ticket = kerb_ticket
        self._extra_conf = dict(extra_conf or {})
        self._temp_dir = temp_dir
        super().__init__(prefix_path, *args, **kwargs)
        self._init_args = (prefix_path,)
        self._init_kwargs.update(
            host=host,
            port=port,
            user=user,
            kerb_ticket=kerb_ticket,
            driver=driver,
            extra_conf=extra_conf,
            temp_dir=temp_dir,
        )

    @classmethod
    def matches(cls, path: str) -> bool:
        """``hdfs://`` URLs."""
        return str(path).startswith(cls.FS_PREFIX)

    def parse_url(self, url: str) -> tuple[Optional[str], Optional[str], Optional[int], str, int]:
        """``(prefix, host, port, path, path_offset)`` of an HDFS URL, as Horovod parses it.

        Example::

            store.parse_url("hdfs://nn:8020/user/me")   # ('hdfs://', 'nn', 8020, '/user/me', 11)
        """
        match = re.search(self.URL_PATTERN, url)
        port = match.group(3)
        return (
            match.group(1),
            match.group(2),
            int(port) if port is not None else None,
            match.group(4),
            match.start(4),
        )

    def _arrow_filesystem_settings(self) -> Optional[dict]:
        return {
            "host": self._host or "default",
            "port": self._port or 0,
            "user": self._user,
            "kerb_ticket": self._kerb_ticket,
            "extra_conf": self._extra_conf,
        }

    @classmethod
    def filesystem_prefix(cls) -> str:
        """The URL scheme of this store's paths (``hdfs://``)."""
        return cls.FS_PREFIX

    def path_prefix(self) -> str:
        """``hdfs://namenode:port`` as written in the prefix (``hdfs://`` when absent)."""
        return self._url_prefix

    def get_full_path(self, path: str) -> str:
        """``/user/x`` → ``hdfs://namenode:port/user/x`` (full paths unchanged)."""
        if _SCHEME.match(path):
            return path
        return self._url_prefix + path

    def _native_location(self, full_path: str) -> str:
        match = self.URL_PREFIX_REGEX.match(full_path)
        if match and match.group(1) == "hdfs" and not match.group(2) and self._authority:
            return f"hdfs://{self._authority}{full_path[match.end() :]}"
        return full_path

    def _native_options(self) -> dict[str, str]:
        return {**self._options, **_flat_options(self._extra_conf)}

    def _prepare_environment(self) -> None:
        if self._user:
            os.environ["HADOOP_USER_NAME"] = self._user
        if self._kerb_ticket:
            os.environ["KRB5CCNAME"] = str(self._kerb_ticket)

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        """A context manager factory yielding a temporary directory under ``temp_dir``."""
        check_run_id(run_id)
        return _TempDir(self._temp_dir)


class DBFSLocalStore(FilesystemStore):
    """A store on Databricks DBFS through its local ``/dbfs`` mount.

    ``prefix_path`` is ``dbfs:/path``, ``/dbfs/path``, ``file:///dbfs/path`` or
    ``file:/dbfs/path``; all are normalized to ``/dbfs/path``. The mount's location can be
    moved with ``KOLO_DBFS_MOUNT`` (tests point it at a temporary directory).

    Example::

        store = DBFSLocalStore("dbfs:/ml/experiments")
        store.prefix_path                  # '/dbfs/ml/experiments'
    """

    DBFS_PATH_FORMAT_ERROR = (
        "The provided path is not a DBFS path: {}, Please provide a path starting with "
        "`/dbfs/...` or `dbfs:/...` or `file:/dbfs/...` or `file:///dbfs/...`."
    )

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        normalized = self.normalize_datbricks_path(str(os.fspath(prefix_path)))
        if not normalized.startswith("/dbfs/"):
            warnings.warn(
                f"The provided prefix_path might be ephemeral: {prefix_path} Please provide a "
                "prefix_path starting with `/dbfs/...`",
                stacklevel=2,
            )
        super().__init__(normalized, *args, **kwargs)
        self._init_args = (prefix_path,)

    @classmethod
    def matches(cls, path: str) -> bool:
        """``dbfs:/``, ``/dbfs/``, ``file:///dbfs/`` and ``file:/dbfs/`` paths."""
        return cls.matches_dbfs(path)

    @classmethod
    def matches_dbfs(cls, path: str) -> bool:
        """Horovod's name of :meth:`matches`."""
        path = str(path)
        return (
            (path.startswith("dbfs:/") and not path.startswith("dbfs://"))
            or path.startswith("/dbfs/")
            or path.startswith("file:///dbfs/")
            or path.startswith("file:/dbfs/")
        )

    @staticmethod
    def normalize_datbricks_path(path: str) -> str:
        """``dbfs:/x``, ``file:///dbfs/x``, ``file:/dbfs/x`` → ``/dbfs/x`` (Horovod's name)."""
        if path.startswith("dbfs:/") and not path.startswith("dbfs://"):
            return "/dbfs" + path[5:]
        if path.startswith("file:///dbfs/"):
            return path[7:]
        if path.startswith("file:/dbfs/"):
            return path[5:]
        return path

    @staticmethod
    def normalize_path(path: str) -> str:
        """``dbfs:/x``, ``/dbfs/x``, ``file:///dbfs/x``, ``file:/dbfs/x`` → ``/dbfs/x``; any
        other path raises ``ValueError`` (:class:`~kolo.exceptions.InvalidValueError`), as
        Horovod's ``DBFSLocalStore.normalize_path``.

        Example::

            DBFSLocalStore.normalize_path("dbfs:/ml/exp")     # '/dbfs/ml/exp'
        """
        if not DBFSLocalStore.matches_dbfs(path):
            raise InvalidValueError(DBFSLocalStore.DBFS_PATH_FORMAT_ERROR.format(path))
        return DBFSLocalStore.normalize_datbricks_path(path)

    def get_full_path(self, path: str) -> str:
        """``path`` as the local ``/dbfs/...`` path Databricks mounts."""
        return self.normalize_datbricks_path(path)

    def get_localized_path(self, path: str) -> str:
        """``path`` as ``/dbfs/...`` (Horovod's)."""
        return self.normalize_datbricks_path(path)

    def _default_checkpoint_filename(self) -> str:
        # Horovod's DBFSLocalStore uses TensorFlow's SavedModel name.
        return "checkpoint.tf"
