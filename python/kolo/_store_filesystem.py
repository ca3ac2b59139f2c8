"""The pyarrow filesystem behind a store's Horovod-compatible ``fs``, ``get_filesystem()`` and
``get_parquet_dataset()`` (internal).

kolo's stores do their own I/O in the Rust core; these methods exist for user code written
against Horovod's store, which hands ``store.fs`` (an fsspec filesystem) and
``store.get_parquet_dataset(path)`` (a ``pyarrow.parquet.ParquetDataset``) to other libraries.
They need pyarrow (and fsspec for ``fs``). Local paths, ``s3://`` (the store's object_store
options mapped to pyarrow's) and ``hdfs://`` (pyarrow's ``HadoopFileSystem``, which needs
libhdfs as Horovod's ``HDFSStore.fs`` does) are served.

Example::

    fs = arrow_filesystem("s3://bucket/exp", {"aws_endpoint": "http://127.0.0.1:9000"}, None)
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any, Optional
from urllib.parse import urlsplit

from kolo.exceptions import StoreError

#: object_store option keys (with and without the ``aws_`` prefix) → pyarrow S3 arguments.
_S3_KEYS = {
    "access_key_id": "access_key",
    "secret_access_key": "secret_key",
    "session_token": "session_token",
    "token": "session_token",
    "region": "region",
}
_S3_ENDPOINT_KEYS = ("endpoint", "endpoint_url")
_TRUE = ("1", "true", "yes", "on")


def _pyarrow_fs() -> Any:
    try:
        import pyarrow.fs as pafs
    except ImportError as error:
        raise StoreError(
            "this store method hands out a pyarrow filesystem, as Horovod's does: pip install "
            "pyarrow (kolo's own store methods — read, write_text, exists, list — need none)"
        ) from error
    return pafs


def _s3(options: dict[str, str]) -> Any:
    pafs = _pyarrow_fs()
    kwargs: dict[str, Any] = {}
    scheme = None
    for key, value in options.items():
        name = key.lower().removeprefix("aws_")
        if name in _S3_KEYS:
            kwargs[_S3_KEYS[name]] = value
        elif name in _S3_ENDPOINT_KEYS:
            parts = urlsplit(value)
            if parts.scheme:
                scheme, value = parts.scheme, parts.netloc + parts.path
            kwargs["endpoint_override"] = value
        elif name == "allow_http" and value.lower() in _TRUE and scheme is None:
            scheme = "http"
    if scheme is not None:
        kwargs["scheme"] = scheme
    return pafs.S3FileSystem(**kwargs)


def arrow_filesystem(url: str, options: dict[str, str], hdfs: Optional[dict]) -> Any:
    """The ``pyarrow.fs.FileSystem`` for the store location ``url``; ``hdfs`` holds an
    HDFSStore's ``host``/``port``/``user``/``kerb_ticket``/``extra_conf``.

    Example::

        arrow_filesystem("/tmp/exp", {}, None)      # pyarrow.fs.LocalFileSystem
    """
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    pafs = _pyarrow_fs()
    if scheme in ("", "file"):
        return pafs.LocalFileSystem()
    if scheme in ("s3", "s3a"):
        return _s3(options)
    if scheme == "hdfs":
        settings = dict(hdfs or {})
        try:
            return pafs.HadoopFileSystem(
                settings.get("host") or "default",
                int(settings.get("port") or 0),
                user=settings.get("user"),
                kerb_ticket=settings.get("kerb_ticket"),
                extra_conf=settings.get("extra_conf") or None,
            )
        except OSError as error:
            raise StoreError(
                f"pyarrow's HadoopFileSystem for {url} needs libhdfs and a JVM (as Horovod's "
                f"HDFSStore.fs does): {error}. kolo's own store methods reach HDFS without them"
            ) from error
    raise StoreError(
        f"a pyarrow filesystem for {scheme}:// stores is not provided; use the store's own "
        "methods (read, write_text, exists, list, sync_fn) or pyarrow.fs directly"
    )


def fsspec_filesystem(arrow_fs: Any) -> Any:
    """``arrow_fs`` behind fsspec's interface (``open``, ``exists``, ``ls``, ``put_file``...),
    which Horovod's ``store.fs`` is.

    Example::

        fs = fsspec_filesystem(pyarrow.fs.LocalFileSystem())
        fs.exists("/tmp")
    """
    try:
        from fsspec.implementations.arrow import ArrowFSWrapper
    except ImportError as error:
        raise StoreError(
            "store.fs is an fsspec filesystem, as in Horovod: pip install fsspec"
        ) from error
    return ArrowFSWrapper(arrow_fs)


def host_hash() -> str:
    """This host's hash as Horovod's Spark util computes it (short hostname, md5 of hostname,
    kernel namespaces and ``CONTAINER_ID``).

    Example::

        host_hash()     # 'worker1-3f2a...'
    """
    hostname = socket.gethostname()
    namespaces = []
    if os.path.isdir("/proc/self/ns"):
        for name in os.listdir("/proc/self/ns"):
            namespaces.append(os.readlink(os.path.join("/proc/self/ns", name)))
    info = f"{hostname}-{' '.join(namespaces)}"
    container = os.environ.get("CONTAINER_ID")
    if container:
        info = f"{info}-{container}"
    return f"{hostname.split('.')[0]}-{hashlib.md5(info.encode()).hexdigest()}"
