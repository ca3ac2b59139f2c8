"""Real storage servers on 127.0.0.1 for the test suite, as pytest fixtures.

Session fixtures ``s3_server`` (moto_server), ``gcs_server`` (fake-gcs-server), ``azure_server``
(Azurite) and ``hdfs_server`` (Hadoop's MiniDFSCluster) each start one server on a free port,
wait (with a timeout) until it answers, create a fresh bucket / container / directory and yield an
:class:`Emulator` describing how to reach it. Function fixtures ``s3_prefix``, ``gcs_prefix``,
``azure_prefix`` and ``hdfs_prefix`` give each test its own unique prefix inside that bucket, and
``remote_prefix`` runs a test once per backend.

The binaries come from ``dev/emulators.sh`` (into ``.tools/``) and ``dev/setup.sh`` (moto); when one
is missing the fixture skips with the command to run. A server that is installed but fails to start
is an error that shows the tail of its log. Servers bind 127.0.0.1 only and run in their own
process group, which teardown kills; a server also gets SIGKILL if pytest itself dies.

Example::

    def test_round_trip(s3_prefix):
        store = kolo.store.Store(s3_prefix.url, storage_options=s3_prefix.storage_options)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, replace
from email.message import Message
from email.utils import formatdate
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from kolo.common.util import env as env_set

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools"
PROVISION = "dev/emulators.sh"
STARTUP_TIMEOUT_S = 60.0
MINIDFS_STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

# Azurite's single built-in account and its published, well-known key.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURE_API_VERSION = "2021-08-06"


@dataclass(frozen=True)
class Emulator:
    """How to reach one fresh bucket (container, directory) on a storage server.

    ``url`` is the store prefix (``s3://bucket``, ``gs://bucket``, ``az://container``,
    ``hdfs://127.0.0.1:PORT/dir``); ``storage_options`` are object_store config keys;
    ``env`` holds environment variables a client also needs (already set in this process for the
    session); ``endpoint`` is the server's own address; ``http_url`` is the plain-HTTP API used to
    check the server without kolo (WebHDFS for HDFS); ``bucket`` is the bucket / container / dir.
    """

    url: str
    storage_options: dict[str, str]
    env: dict[str, str]
    endpoint: str
    http_url: str = ""
    bucket: str = ""

    def child(self, prefix: str) -> Emulator:
        """The same server and options with ``prefix`` appended to the URL."""
        return replace(self, url=f"{self.url.rstrip('/')}/{prefix.strip('/')}")


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if pytest dies without running teardown (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class ServerProcess:
    """A server started in its own process group with output in log files; stops on teardown."""

    def __init__(self, name: str, argv: list[str], workdir: Path, stdin_pipe: bool = False) -> None:
        self.name = name
        self.stdout_path = workdir / f"{name}.stdout.log"
        self.stderr_path = workdir / f"{name}.stderr.log"
        # Scratch files (Jetty's webapp dirs, telemetry caches) land in the test's tmp dir.
        scratch = workdir / "tmp"
        scratch.mkdir(exist_ok=True)
        env = {**os.environ, "TMPDIR": str(scratch)}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's stdout and stderr, for failure messages."""
        parts = []
        for path in (self.stdout_path, self.stderr_path):
            text = path.read_text(errors="replace") if path.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:])
            parts.append(f"--- {path.name} (last {lines} lines) ---\n{tail}")
        return "\n".join(parts)

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Polls ``ready`` until true; fails with the log tail on exit or after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.name} exited with code {self.proc.returncode} before {what}\n"
                    + self.log_tail(),
                    pytrace=False,
                )
            with contextlib.suppress(OSError):
                if ready():
                    return
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(
                    f"{self.name}: no {what} within {timeout:.0f} s\n" + self.log_tail(),
                    pytrace=False,
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Closes stdin (a clean-stop signal for MiniDFS), then SIGTERM / SIGKILL the group."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        self.proc.wait(timeout=STOP_TIMEOUT_S)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unique_name(prefix: str = "kolo") -> str:
    """A bucket-safe unique name (lowercase letters, digits and dashes)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes, Message]:
    """One HTTP request without following redirects; returns (status, body, headers).

    ``headers`` looks names up case-insensitively (``headers["etag"]``).
    """

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.skip(f"{what} is not provisioned ({path} missing); run `{PROVISION}`")
    return path


# ---------------------------------------------------------------------------------------------
# S3: moto_server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[Emulator]:
    """moto_server on 127.0.0.1 with a fresh bucket; ``url`` is ``s3://<bucket>``."""
    moto = _require(Path(sys.executable).parent / "moto_server", "moto_server (dev/setup.sh)")
    boto3 = pytest.importorskip("boto3", reason="boto3 comes with moto[server]; run dev/setup.sh")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    workdir = tmp_path_factory.mktemp("s3_server")
    server = ServerProcess("moto_server", [str(moto), "-H", "127.0.0.1", "-p", str(port)], workdir)
    try:
        server.wait_until(
            lambda: http("GET", f"{endpoint}/moto-api/", timeout=2)[0] == 200,
            STARTUP_TIMEOUT_S,
            "HTTP answer",
        )
        bucket = unique_name()
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        ).create_bucket(Bucket=bucket)
        yield Emulator(
            url=f"s3://{bucket}",
            storage_options={
                "aws_endpoint": endpoint,
                "aws_allow_http": "true",
                "aws_access_key_id": "test",
                "aws_secret_access_key": "test",
                "aws_region": "us-east-1",
                "aws_virtual_hosted_style_request": "false",
            },
            env={},
            endpoint=endpoint,
            http_url=endpoint,
            bucket=bucket,
        )
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# GCS: fake-gcs-server
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory) -> Iterator[Emulator]:
    """fake-gcs-server (HTTP, in-memory) with a fresh bucket; ``url`` is ``gs://<bucket>``.

    The server is tests/support/fake-gcs: fake-gcs-server plus the XML API object PUT and multipart
    upload calls that object_store's GCS client makes and upstream does not serve yet.

    object_store reaches it through a service-account file with ``gcs_base_url`` pointing here and
    ``disable_oauth: true`` (no tokens, no signing); ``google_service_account`` is its path.
    """
    binary = _require(TOOLS / "bin" / "kolo-fake-gcs", "kolo-fake-gcs (fake-gcs-server)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    workdir = tmp_path_factory.mktemp("gcs_server")
    argv = [str(binary), "-host", "127.0.0.1", "-port", str(port)]
    server = ServerProcess("fake-gcs-server", argv, workdir)
    try:
        server.wait_until(
            lambda: http("GET", f"{endpoint}/storage/v1/b", timeout=2)[0] == 200,
            STARTUP_TIMEOUT_S,
            "JSON API answer",
        )
        bucket = unique_name()
        status, body, _ = http(
            "POST",
            f"{endpoint}/storage/v1/b?project=kolo-test",
            json.dumps({"name": bucket}).encode(),
            {"Content-Type": "application/json"},
        )
        if status != 200:
            pytest.fail(f"fake-gcs-server: creating bucket {bucket} gave {status}: {body!r}")
        credentials = workdir / "service-account.json"
        credentials.write_text(
            json.dumps(
                {
                    "gcs_base_url": endpoint,
                    "disable_oauth": True,
                    "client_email": "",
                    "private_key": "",
                    "private_key_id": "",
                }
            )
        )
        yield Emulator(
            url=f"gs://{bucket}",
            storage_options={"google_service_account": str(credentials)},
            env={},
            endpoint=endpoint,
            http_url=endpoint,
            bucket=bucket,
        )
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Azure: Azurite (blob service only)
# ---------------------------------------------------------------------------------------------


def azure_request(
    method: str,
    endpoint: str,
    path: str,
    query: dict[str, str] | None = None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, Message]:
    """An Azure Blob REST call signed with Azurite's shared key (path-style URL).

    ``endpoint`` is ``http://127.0.0.1:PORT/devstoreaccount1``; ``path`` follows it, e.g.
    ``/container`` or ``/container/blob``.
    """
    query = query or {}
    parsed = urllib.parse.urlsplit(endpoint)
    url_path = parsed.path.rstrip("/") + path
    all_headers = {
        "x-ms-date": formatdate(usegmt=True),
        "x-ms-version": AZURE_API_VERSION,
        **(headers or {}),
    }
    if body:
        all_headers["Content-Length"] = str(len(body))
        # urllib would add an unsigned form Content-Type; sign an explicit one instead.
        all_headers.setdefault("Content-Type", "application/octet-stream")
    lower = {key.lower(): value for key, value in all_headers.items()}
    string_to_sign = "\n".join(
        [
            method,
            lower.get("content-encoding", ""),
            lower.get("content-language", ""),
            lower.get("content-length", ""),
            lower.get("content-md5", ""),
            lower.get("content-type", ""),
            "",  # Date: x-ms-date is used instead
            lower.get("if-modified-since", ""),
            lower.get("if-match", ""),
            lower.get("if-none-match", ""),
            lower.get("if-unmodified-since", ""),
            lower.get("range", ""),
        ]
    )
    canonical_headers = "".join(
        f"{key}:{lower[key].strip()}\n" for key in sorted(lower) if key.startswith("x-ms-")
    )
    canonical_resource = f"/{AZURITE_ACCOUNT}{url_path}" + "".join(
        f"\n{key.lower()}:{query[key]}" for key in sorted(query, key=str.lower)
    )
    to_sign = f"{string_to_sign}\n{canonical_headers}{canonical_resource}"
    digest = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()
    all_headers["Authorization"] = (
        f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(digest).decode()}"
    )
    url = f"{parsed.scheme}://{parsed.netloc}{url_path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    return http(method, url, body or None, all_headers)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory) -> Iterator[Emulator]:
    """Azurite's blob service with a fresh container; ``url`` is ``az://<container>``.

    object_store's emulator mode (``azure_storage_use_emulator``) reads the blob endpoint from the
    environment variable ``AZURITE_BLOB_STORAGE_URL`` (it has no config key for it); this fixture
    sets it in ``os.environ`` for the session and lists it in ``env`` for child processes.
    """
    main_js = TOOLS / "azurite" / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    _require(main_js, "Azurite")
    node = shutil.which("node")
    if node is None:
        pytest.skip("Azurite needs node on PATH")
    port = free_port()
    blob_url = f"http://127.0.0.1:{port}"
    endpoint = f"{blob_url}/{AZURITE_ACCOUNT}"
    workdir = tmp_path_factory.mktemp("azure_server")
    argv = [
        node, str(main_js),
        "--blobHost", "127.0.0.1",
        "--blobPort", str(port),
        "--location", str(workdir / "data"),
        "--silent",
        "--skipApiVersionCheck",
        "--loose",
    ]  # fmt: skip
    server = ServerProcess("azurite", argv, workdir)
    try:
        server.wait_until(
            lambda: azure_request("GET", endpoint, "/", {"comp": "list"})[0] == 200,
            STARTUP_TIMEOUT_S,
            "signed list-containers answer",
        )
        container = unique_name()
        status, body, _ = azure_request("PUT", endpoint, f"/{container}", {"restype": "container"})
        if status != 201:
            pytest.fail(f"Azurite: creating container {container} gave {status}: {body!r}")
        env = {"AZURITE_BLOB_STORAGE_URL": blob_url}
        with env_set(**env):  # in os.environ, so in-process clients and children see it
            yield Emulator(
                url=f"az://{container}",
                storage_options={
                    "azure_storage_account_name": AZURITE_ACCOUNT,
                    "azure_storage_account_key": AZURITE_KEY,
                    "azure_storage_use_emulator": "true",
                },
                env=env,
                endpoint=endpoint,
                http_url=endpoint,
                bucket=container,
            )
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# HDFS: MiniDFSCluster (tests/support/minidfs)
# ---------------------------------------------------------------------------------------------


def _minidfs_ready_line(server: ServerProcess) -> Optional[str]:
    text = server.stdout_path.read_text(errors="replace")
    return next((line for line in text.splitlines() if line.startswith("READY ")), None)


def webhdfs_url(http_url: str, path: str, op: str, **params: str) -> str:
    """A WebHDFS REST URL (``/webhdfs/v1<path>?op=...``) as user ``kolo``."""
    query = urllib.parse.urlencode({"op": op, "user.name": "kolo", **params})
    return f"{http_url}/webhdfs/v1{path}?{query}"


@pytest.fixture(scope="session")
def hdfs_server(tmp_path_factory) -> Iterator[Emulator]:
    """A one-DataNode MiniDFSCluster with a fresh directory; ``url`` is ``hdfs://127.0.0.1:P/dir``.

    Permissions, Kerberos and SASL are off, the DataNode advertises 127.0.0.1, and WebHDFS
    answers on ``http_url``. Needs ``java`` on PATH and ``dev/emulators.sh`` to have built the
    launcher.
    """
    jar = _require(TOOLS / "minidfs" / "build" / "minidfs-launcher.jar", "the MiniDFS launcher")
    java = shutil.which("java")
    if java is None:
        pytest.skip("MiniDFSCluster needs java (17+) on PATH")
    rpc_port, http_port = free_port(), free_port()
    workdir = tmp_path_factory.mktemp("hdfs_server")
    classpath = f"{jar}{os.pathsep}{TOOLS / 'minidfs' / 'lib' / '*'}"
    argv = [
        java,
        "-Xmx512m",
        f"-Djava.io.tmpdir={workdir / 'tmp'}",
        # Jersey's JAXB (WebHDFS) reflects into java.lang on Java 17.
        "--add-opens", "java.base/java.lang=ALL-UNNAMED",
        "-cp", classpath,
        "kolo.minidfs.MiniDfsLauncher",
        str(rpc_port), str(http_port), str(workdir / "dfs"),
    ]  # fmt: skip
    server = ServerProcess("minidfs", argv, workdir, stdin_pipe=True)
    try:
        server.wait_until(
            lambda: _minidfs_ready_line(server) is not None,
            MINIDFS_STARTUP_TIMEOUT_S,
            "READY line",
        )
        _, namenode, http_url = (_minidfs_ready_line(server) or "").split()
        directory = f"/{unique_name()}"
        status, body, _ = http("PUT", webhdfs_url(http_url, directory, "MKDIRS"))
        if status != 200 or not json.loads(body).get("boolean"):
            pytest.fail(f"MiniDFS: MKDIRS {directory} gave {status}: {body!r}")
        yield Emulator(
            url=f"{namenode}{directory}",
            storage_options={},
            env={},
            endpoint=namenode,
            http_url=http_url,
            bucket=directory.lstrip("/"),
        )
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Per-test prefixes
# ---------------------------------------------------------------------------------------------


def _test_prefix(request) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")
    return f"{name[:40]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def s3_prefix(s3_server, request) -> Emulator:
    """A unique prefix in the session's S3 bucket for one test."""
    return s3_server.child(_test_prefix(request))


@pytest.fixture
def gcs_prefix(gcs_server, request) -> Emulator:
    """A unique prefix in the session's GCS bucket for one test."""
    return gcs_server.child(_test_prefix(request))


@pytest.fixture
def azure_prefix(azure_server, request) -> Emulator:
    """A unique prefix in the session's Azurite container for one test."""
    return azure_server.child(_test_prefix(request))


@pytest.fixture
def hdfs_prefix(hdfs_server, request) -> Emulator:
    """A unique directory under the session's HDFS directory for one test."""
    return hdfs_server.child(_test_prefix(request))


REMOTE_BACKENDS = ("s3", "gcs", "azure", "hdfs")


@pytest.fixture(params=REMOTE_BACKENDS)
def remote_prefix(request) -> Emulator:
    """A unique prefix on each remote backend in turn (the test runs once per backend)."""
    return request.getfixturevalue(f"{request.param}_prefix")
