"""Warm start of ``kolo.spark.run``'s rank processes: after an application's first launch, an
executor's warm rank server (python/kolo/spark/_warm_server.py) forks the rank processes of
later launches, which must behave exactly as fresh ones.

The functions run by the ranks are pickled by value (this module is not importable in the rank
processes), so each keeps its imports inside. Every launch here passes the same ``env=`` (the
server refuses, and restarts for, an environment that differs in more than the launch's own
variables and per-process ones).

The module owns its servers: ``KOLO_SPARK_WARM_DIR`` points the launches at a directory of its
own, so a server that earlier tests of the session started (in the default directory) is never
asked, and the fixture stops this module's servers and checks none is left.
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import cloudpickle
import pytest

import kolo.spark
from kolo import _native
from kolo.exceptions import ConfigError, RankFailedError
from kolo.exceptions import TimeoutError as KoloTimeoutError
from kolo.spark import _warm_client
from kolo.spark._launch_report import LaunchReport
from kolo.spark._warm_server import (
    PER_PROCESS_VARIABLES,
    ServerConfig,
    environment_differences,
    info_path,
    key_files,
    process_start_ticks,
)
from kolo.spark._warm_start import (
    DIR_VAR,
    SERVER_CODE,
    STALE_KEY_S,
    WarmSlot,
    mentions_fork_unsafe,
    private_directory,
    serving,
    slot_for,
    stop_server,
    sweep_stale_keys,
    wait_for_server,
    warm_start_options,
)

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])

USER_MODULE = "kolo_warm_user_module"


def with_path(directory: Path) -> str:
    """``directory`` in front of this process's PYTHONPATH (which CI leaves unset: kolo is an
    editable install there), without an empty entry (which would put the working directory on
    the ranks' ``sys.path``)."""
    return os.pathsep.join(p for p in [str(directory), os.environ.get("PYTHONPATH", "")] if p)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A directory of the user's own code (on the ranks' PYTHONPATH, not site-packages)."""
    path = tmp_path_factory.mktemp("warm-user-code")
    (path / f"{USER_MODULE}.py").write_text("VALUE = 1\n")
    return path


#: How long a test waits for a server to serve (it imports numpy and kolo).
SERVE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def warm_dir(spark, tmp_path_factory) -> Iterator[Path]:
    """This module's own server directory (``KOLO_SPARK_WARM_DIR`` for every launch here; the
    executor creates it, 0700). Afterwards this module's servers are stopped, and no process of
    this directory (a server, a rank it forked) is left."""
    directory = tmp_path_factory.mktemp("warm") / "servers"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DIR_VAR, str(directory))
        yield directory
    for slot, _ in serving(str(directory)):
        stop_server(slot, 10.0)
    deadline = time.monotonic() + 10
    while processes_naming(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_naming(directory) == [], "a warm rank server outlived its test module"


def processes_naming(directory: Path) -> list[int]:
    """The live processes whose command line names ``directory`` (its servers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                argv = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            if str(directory).encode() in argv and process_start_ticks(int(entry)) is not None:
                pids.append(int(entry))
    return pids


@pytest.fixture(scope="module")
def warm(warm_dir, user_dir) -> tuple[Path, dict[str, str]]:
    """This application's warm rank server for this interpreter, started by a first launch
    (its directory, and the ``env=`` every launch here passes)."""
    env = {"PYTHONPATH": with_path(user_dir)}
    assert kolo.spark.run(numpy_and_user_fn, num_proc=2, env=env)[0][2] == 1
    assert os.stat(warm_dir).st_mode & 0o777 == 0o700
    current_server(warm_dir)
    return warm_dir, env


def current_server(directory: Path) -> tuple[WarmSlot, dict]:
    """The slot and description of the one server that serves this module now."""
    return wait_for_server(str(directory), SERVE_TIMEOUT_S)


def server_pid(directory: Path) -> int:
    return int(current_server(directory)[1]["pid"])


def numpy_and_user_fn():
    """Imports an installed module and the user's own; says who this rank process is."""
    import os

    import kolo_warm_user_module
    import numpy

    print(f"rank {os.environ['KOLO_RANK']} says hello")
    return (
        os.getpid(),
        os.getppid(),
        kolo_warm_user_module.VALUE,
        float(numpy.arange(4.0) @ numpy.arange(4.0)),
        os.environ["KOLO_RANK"],
        os.getcwd(),
        sorted(k for k in os.environ if k.startswith("KOLO_SPARK_WARM")),
    )


def test_a_later_launch_forks_its_ranks_from_the_warm_server(warm, monkeypatch):
    """The second launch's rank processes are children of the executor's warm server (the
    launch report says so and has a ``warm_fork`` phase); they run the function with their own
    rank variables, the fresh rank's working directory, numpy working after the fork, and their
    output streamed with rank prefixes. The server pre-imported numpy (installed), never the
    user's module (on PYTHONPATH, outside site-packages)."""
    directory, env = warm
    _, info = current_server(directory)
    assert "numpy" in info["modules"] and USER_MODULE not in info["modules"], info
    monkeypatch.setenv("KOLO_SPARK_WARM_START", "0")
    (fresh, _) = kolo.spark.run(numpy_and_user_fn, num_proc=2, env=env)
    monkeypatch.delenv("KOLO_SPARK_WARM_START")
    reports: list[LaunchReport] = []
    out = io.StringIO()
    results = kolo.spark.run(
        numpy_and_user_fn, num_proc=2, env=env, stdout=out, _on_launch_report=reports.append
    )
    (report,) = reports
    assert report.warm_ranks() == [0, 1], report.ranks
    assert "warm_fork" in dict(report.phases()) and "forked by a warm" in report.describe()
    pid = info["pid"]
    for rank, (child, parent, value, dot, kolo_rank, cwd, knobs) in enumerate(results):
        assert parent == pid and child != pid
        assert (value, dot, kolo_rank, knobs) == (1, 14.0, str(rank), [])
        assert cwd == fresh[5]
        assert f"[{rank}]<stdout>:rank {rank} says hello" in out.getvalue()
    assert fresh[1] != pid


def test_an_edited_user_module_is_imported_fresh(warm, user_dir):
    """The user edits their module between launches: the forked ranks import the new one."""
    directory, env = warm
    pid = server_pid(directory)
    module = user_dir / f"{USER_MODULE}.py"
    module.write_text("VALUE = 2\n")
    try:
        results = kolo.spark.run(numpy_and_user_fn, num_proc=2, env=env)
    finally:
        module.write_text("VALUE = 1\n")
    assert [r[1] for r in results] == [pid, pid]
    assert [r[2] for r in results] == [2, 2]


def fail_or_hang_fn(pid_dir):
    """Rank 1 records its pid and hangs; rank 0 fails once rank 1 is up."""
    import os
    import time

    rank = int(os.environ["KOLO_RANK"])
    if rank == 1:
        with open(os.path.join(pid_dir, "hanging.pid"), "w") as file:
            file.write(f"{os.getpid()} {os.getppid()}")
        time.sleep(120)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(pid_dir, "hanging.pid")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    raise ValueError("rank 0 fails on purpose")


def test_a_failure_stops_the_forked_ranks(warm, tmp_path):
    """One forked rank fails: the launch raises its error and the other forked rank (a child
    of the server, not of the task) is killed."""
    directory, env = warm
    pid = server_pid(directory)
    with pytest.raises(RankFailedError, match="rank 0 fails on purpose"):
        kolo.spark.run(fail_or_hang_fn, args=(str(tmp_path),), num_proc=2, env=env)
    hanging, parent = map(int, (tmp_path / "hanging.pid").read_text().split())
    assert parent == pid
    deadline = time.monotonic() + 10
    while process_start_ticks(hanging) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_start_ticks(hanging) is None, "the forked rank outlived the abort"


def hang_fn(pid_dir):
    """Records this rank's pid and hangs."""
    import os
    import time

    with open(os.path.join(pid_dir, f"rank{os.environ['KOLO_RANK']}.pid"), "w") as file:
        file.write(str(os.getpid()))
    time.sleep(120)


def clients_of(slot: WarmSlot) -> list[int]:
    """The pids of the warm clients talking to ``slot``'s server."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"-S" in argv and slot.key.encode() in argv:
            pids.append(int(entry))
    return pids


def test_a_killed_client_takes_its_forked_rank_with_it(warm, tmp_path):
    """The task's process (the client) is SIGKILLed, as after the abort's grace: the server
    sees its connection close and kills the forked rank; the launch fails, no rank survives."""
    directory, env = warm
    slot, _ = current_server(directory)
    pid_dir = str(tmp_path)
    with pytest.raises(RankFailedError):

        def kill_clients() -> None:
            deadline = time.monotonic() + 60
            while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            for client in clients_of(slot):
                os.kill(client, 9)

        killer = threading.Thread(target=kill_clients)
        killer.start()
        try:
            kolo.spark.run(hang_fn, args=(pid_dir,), num_proc=2, env=env, start_timeout=60)
        finally:
            killer.join()
    ranks = [int(path.read_text()) for path in tmp_path.glob("rank*.pid")]
    assert len(ranks) == 2
    deadline = time.monotonic() + 10
    while any(process_start_ticks(r) is not None for r in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(process_start_ticks(r) is None for r in ranks), "a forked rank outlived its client"


def killed_fn():
    import os
    import signal

    if os.environ["KOLO_RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getppid()


def test_a_forked_rank_killed_by_a_signal_is_reported_as_such(warm):
    """The client ends as its rank did: a rank killed by SIGKILL fails the launch with
    "killed by signal 9", as a fresh one does."""
    _, env = warm
    with pytest.raises(RankFailedError, match="signal 9"):
        kolo.spark.run(killed_fn, num_proc=2, env=env)


def test_the_off_knob_starts_fresh_rank_processes(warm, monkeypatch):
    """``KOLO_SPARK_WARM_START=0`` on the driver: no rank is forked; a bad value is a
    ConfigError naming the variable."""
    directory, env = warm
    pid = server_pid(directory)
    monkeypatch.setenv("KOLO_SPARK_WARM_START", "0")
    reports: list[LaunchReport] = []
    results = kolo.spark.run(
        numpy_and_user_fn, num_proc=2, env=env, _on_launch_report=reports.append
    )
    assert all(r[1] != pid for r in results)
    assert reports[0].warm_ranks() == []
    monkeypatch.setenv("KOLO_SPARK_WARM_START", "maybe")
    with pytest.raises(ConfigError, match="KOLO_SPARK_WARM_START"):
        kolo.spark.run(numpy_and_user_fn, num_proc=2, env=env)
    monkeypatch.setenv("KOLO_SPARK_WARM_START", "1")
    monkeypatch.setenv("KOLO_SPARK_WARM_IDLE_SECONDS", "-3")
    with pytest.raises(ConfigError, match="KOLO_SPARK_WARM_IDLE_SECONDS"):
        warm_start_options()
    monkeypatch.delenv("KOLO_SPARK_WARM_IDLE_SECONDS")
    monkeypatch.setenv(DIR_VAR, "relative/dir")
    with pytest.raises(ConfigError, match=DIR_VAR):
        warm_start_options()


def test_a_launch_that_differs_only_in_per_process_variables_is_forked(warm):
    """The full-suite failure of the first version: ``SparkBackend`` copies the driver's
    ``os.environ`` into ``env=``, where pytest's ``PYTEST_CURRENT_TEST`` and the shell's ``_``,
    ``SHLVL``, ``OLDPWD`` differ from test to test. Such a launch is forked by the same server,
    which keeps serving; the forked ranks see the launch's own values."""
    directory, env = warm
    pid = server_pid(directory)
    per_process = {
        "PYTEST_CURRENT_TEST": "tests/test_other.py::test_other (call)",
        "_": "/usr/bin/another-program",
        "SHLVL": "7",
        "OLDPWD": "/",
    }
    reports: list[LaunchReport] = []
    results = kolo.spark.run(
        per_process_fn, num_proc=2, env={**env, **per_process}, _on_launch_report=reports.append
    )
    assert reports[0].warm_ranks() == [0, 1], reports[0].describe()
    assert [r[0] for r in results] == [pid, pid]
    assert all(r[1] == per_process for r in results), results
    assert server_pid(directory) == pid


def per_process_fn():
    import os

    names = ("PYTEST_CURRENT_TEST", "_", "SHLVL", "OLDPWD")
    return os.getppid(), {name: os.environ.get(name) for name in names}


# The server alone (no Spark): authentication, idle timeout, the watched processes' end.


#: The environment of the servers these tests start by hand.
SERVER_ENV = dict(os.environ)
#: The key of the servers these tests start by hand.
TEST_KEY = "k" * 24


def spawn_server(directory: Path, idle_s: float, watch=()) -> subprocess.Popen:
    """Starts a server of ``TEST_KEY`` in ``directory`` (not detached: the test reaps it)."""
    modules = ["cloudpickle", "tensorflow", "kolo.keras", "kolo.spark.task"]
    config = ServerConfig(str(directory), TEST_KEY, idle_s, modules, tuple(watch))
    code = SERVER_CODE.replace("if os.fork():\n    os._exit(0)\n", "")
    return subprocess.Popen([sys.executable, "-c", code, config.to_json()], env=SERVER_ENV)


def start_server(tmp_path: Path, idle_s: float, watch=()) -> tuple[WarmSlot, subprocess.Popen]:
    directory = tmp_path / "warm"
    directory.mkdir(mode=0o700)
    process = spawn_server(directory, idle_s, watch)
    slot, _ = wait_for_server(str(directory), 30.0)
    assert slot.key == TEST_KEY
    return slot, process


def raw_request(slot: WarmSlot, mac_key: bytes, fds: list[int], body: bytes) -> bytes:
    """Sends one request by hand; returns what the server answered (b"" when it hung up)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(_warm_client.socket_path(slot.directory, slot.key))
        greeting = _warm_client.recv_exactly(
            sock, len(_warm_client.MAGIC) + _warm_client.NONCE_BYTES
        )
        nonce = greeting[len(_warm_client.MAGIC) :]
        message = struct.pack("!I", len(body)) + body
        message += _warm_client.request_mac(mac_key, nonce, body)
        socket.send_fds(sock, [message], fds)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
        return b"".join(chunks)


def test_a_request_without_the_secret_is_refused_before_it_is_parsed(tmp_path):
    """A request whose HMAC is not keyed by the server's secret (here: a pickle that would run
    code if loaded) is dropped unanswered and forks nothing; the socket and its directory are
    this user's only; a request with the secret but without the three descriptors is refused
    too; the server keeps serving."""
    slot, process = start_server(tmp_path, idle_s=60)
    try:
        marker = tmp_path / "unpickled"
        evil = cloudpickle.dumps(_Evil(str(marker)))
        assert raw_request(slot, b"not the secret", [0, 1, 2], evil) == b""
        assert raw_request(slot, b"x" * 32, [0, 1, 2], b'{"executable": 1}') == b""
        assert not marker.exists()
        secret = Path(_warm_client.secret_path(slot.directory, slot.key)).read_bytes()
        assert raw_request(slot, secret, [], b"{}") == b""
        assert os.stat(slot.directory).st_mode & 0o777 == 0o700
        for path in (_warm_client.socket_path, _warm_client.secret_path):
            assert os.stat(path(slot.directory, slot.key)).st_mode & 0o077 == 0
        log = Path(slot.directory, slot.key + ".log").read_text()
        assert log.count("authentication is wrong") == 2 and "forked" not in log, log
        assert process.poll() is None
        # With the secret, a well-formed request from another interpreter is refused politely.
        reply = raw_request(slot, secret, [0, 1, 2], json.dumps({"executable": "/x"}).encode())
        assert b'"ok": false' in reply and b"interpreter" in reply
        # Fields of the wrong shape are a refusal, not the server's end.
        bad = {"executable": os.path.realpath(sys.executable), "version": sys.version}
        bad.update(env=SERVER_ENV, launch_names=[], cwd="/", rlimits={"RLIMIT_NOFILE": 7})
        reply = raw_request(slot, secret, [0, 1, 2], json.dumps(bad).encode())
        assert b'"ok": false' in reply and b"malformed" in reply, reply
        time.sleep(1.5)
        assert process.poll() is None and slot.listening()
    finally:
        process.kill()
        process.wait()


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_server_exits_after_its_idle_timeout(tmp_path):
    """A server with no rank and no request exits after ``idle_s`` and removes its socket. It
    imported what it was told but TensorFlow and kolo's Keras adapter (fork-unsafe runtimes)."""
    slot, process = start_server(tmp_path, idle_s=1.0)
    modules = json.loads(Path(info_path(slot.directory, slot.key)).read_text())["modules"]
    assert sorted(modules) == ["cloudpickle", "kolo.spark.task"], modules
    assert process.wait(timeout=15) == 0
    assert not slot.listening()


def test_the_server_exits_when_its_application_ends(tmp_path):
    """A server watches its application's PySpark daemon and the executor's JVM (here two
    stand-in processes): when the daemon ends (the application or session stopped, the JVM
    lives on) the server exits within seconds and its key's files go. A later application
    (another daemon) has another key, so it can never be handed the earlier one's server."""
    daemon = subprocess.Popen(["sleep", "60"])
    jvm = subprocess.Popen(["sleep", "60"])
    try:
        watch = [(p.pid, process_start_ticks(p.pid)) for p in (daemon, jvm)]
        slot, process = start_server(tmp_path, idle_s=300, watch=watch)
        assert process.poll() is None
        daemon.kill()
        daemon.wait()
        assert process.wait(timeout=15) == 0
        assert not slot.listening()
        # The key is dead with its application: none of its files stay behind.
        assert [p for p in key_files(slot.directory, slot.key) if os.path.exists(p)] == []
        later = slot_for(sys.executable, ((daemon.pid + 1, 1), watch[1]), str(tmp_path / "w"))
        same = slot_for(sys.executable, tuple(watch), str(tmp_path / "w"))
        assert later is not None and same is not None and later.key != same.key
    finally:
        daemon.kill()
        jvm.kill()
        daemon.wait()
        jvm.wait()


def test_environment_differences_count_what_matters_only():
    """Per-process variables (a shell's, pytest's, Spark's worker factory's) and the launch's
    own ``KOLO_*`` variables are left out of the comparison; everything that can change what
    an import did counts, including a user's ``KOLO_*`` knob and variables that are new or
    gone."""
    base = {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/code",
        "LD_LIBRARY_PATH": "/lib",
        "CUDA_VISIBLE_DEVICES": "0",
        "OMP_NUM_THREADS": "2",
        "KOLO_RANK": "0",
        "KOLO_LOG_LEVEL": "info",
        **{name: "a" for name in PER_PROCESS_VARIABLES},
    }
    launch = ["KOLO_RANK", "KOLO_TASK_INDEX"]
    same = {**base, "KOLO_RANK": "1", "KOLO_TASK_INDEX": "3"}
    same.update({name: "b" for name in PER_PROCESS_VARIABLES})
    assert environment_differences(base, same, launch) == []
    assert {"_", "PYTEST_CURRENT_TEST", "OLDPWD", "SHLVL", "PWD"} <= PER_PROCESS_VARIABLES
    assert "PYTHON_WORKER_FACTORY_SECRET" in PER_PROCESS_VARIABLES
    for name, value in [
        ("PATH", "/opt/bin"),
        ("PYTHONPATH", "/other"),
        ("LD_LIBRARY_PATH", "/other/lib"),
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("OMP_NUM_THREADS", "8"),
        ("MKL_NUM_THREADS", "1"),
        ("KOLO_LOG_LEVEL", "debug"),
        ("KOLO_FUSION_THRESHOLD", "0"),
        ("LD_PRELOAD", "/lib/libjemalloc.so"),
    ]:
        assert environment_differences(base, {**base, name: value}, launch) == [name]
    gone = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    assert environment_differences(base, gone, launch) == ["PYTHONPATH"]
    # Only the launch's own names that are KOLO_*/HOROVOD_* may be left out.
    assert environment_differences(base, {**base, "PATH": "/x"}, ["PATH"]) == ["PATH"]


def send_request(slot: WarmSlot, request: dict) -> tuple[socket.socket, dict]:
    """Sends ``request`` as the client does (stdin/stdout/stderr: /dev/null); returns the open
    connection (closing it kills a forked rank) and the server's first reply."""
    null = os.open(os.devnull, os.O_RDWR)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect(_warm_client.socket_path(slot.directory, slot.key))
        greeting = _warm_client.recv_exactly(
            sock, len(_warm_client.MAGIC) + _warm_client.NONCE_BYTES
        )
        secret = Path(_warm_client.secret_path(slot.directory, slot.key)).read_bytes()
        body = json.dumps(request).encode()
        mac = _warm_client.request_mac(secret, greeting[len(_warm_client.MAGIC) :], body)
        socket.send_fds(sock, [struct.pack("!I", len(body)) + body + mac], [null, null, null])
        return sock, _warm_client.recv_message(sock)
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(null)


def test_a_retired_server_makes_way_for_its_replacement_while_its_rank_runs(tmp_path):
    """A server retires (a request with another environment) while a rank it forked still
    runs: it stops serving and releases its key at once, so a replacement of the same key
    serves (the first version kept the lock until its ranks ended, and the replacement quit);
    the retired server leaves the replacement's files alone when it exits; a server killed
    outright is never reported as serving by the files it left; waits end with a clear error."""
    slot, first = start_server(tmp_path, idle_s=60)
    driver = _native.LaunchDriver(2, "127.0.0.1:0", 20.0)
    replacement = None
    try:
        # A rank that lives: it waits in its job's registration for a second task.
        job_env = dict(driver.worker_env(0))
        request = _warm_client.build_request(sorted(job_env), time.time())
        request["env"] = {**SERVER_ENV, **job_env}
        rank_conn, reply = send_request(slot, request)
        assert reply["ok"], reply
        rank = int(reply["pid"])
        changed = {**request, "env": {**SERVER_ENV, "KOLO_WARM_TEST_CHANGED": "1"}}
        conn, reply = send_request(slot, changed)
        conn.close()
        assert not reply["ok"] and "KOLO_WARM_TEST_CHANGED" in reply["reason"], reply
        assert first.poll() is None and process_start_ticks(rank) is not None
        assert serving(slot.directory) == []
        replacement = spawn_server(Path(slot.directory), idle_s=60)
        new_slot, info = wait_for_server(slot.directory, 30.0)
        assert info["pid"] == replacement.pid and new_slot.key == slot.key
        # The rank's client goes: the retired server kills it, then exits, leaving the files
        # of its replacement alone.
        rank_conn.close()
        assert first.wait(timeout=15) == 0
        assert process_start_ticks(rank) is None
        assert wait_for_server(slot.directory, 5.0)[1]["pid"] == replacement.pid
        # Killed outright, a server leaves its files behind; they are not a server.
        replacement.kill()
        replacement.wait()
        assert slot.listening() and serving(slot.directory) == []
        with pytest.raises(KoloTimeoutError, match=r"0 warm rank servers serve in .* after 0\.3 s"):
            wait_for_server(slot.directory, 0.3)
    finally:
        driver.shutdown()
        for process in (first, replacement):
            if process is not None:
                process.kill()
                process.wait()


def test_the_server_directory_must_be_this_users_and_private(tmp_path):
    """``KOLO_SPARK_WARM_DIR`` is created 0700 when missing; one that others may enter is
    refused (no warm start), as is one that is not a directory."""
    created = private_directory(str(tmp_path / "new"))
    assert created is not None and os.stat(created).st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert private_directory(str(shared)) is None
    (tmp_path / "file").write_text("")
    assert private_directory(str(tmp_path / "file")) is None


def tensorflow_fn():
    """Names TensorFlow (never imports it here): such a launch must not fork from a server
    that holds torch."""
    import os

    if os.environ.get("NEVER_SET_IN_THIS_TEST"):
        import tensorflow  # noqa: F401
    return os.getppid()


def test_a_function_that_uses_tensorflow_gets_fresh_ranks(warm):
    """A payload naming a fork-unsafe framework (TensorFlow, kolo's Keras adapter, JAX) runs
    fresh rank processes even with a server up; torch-only payloads do not trip the scan."""
    directory, env = warm
    pid = server_pid(directory)
    reports: list[LaunchReport] = []
    parents = kolo.spark.run(tensorflow_fn, num_proc=2, env=env, _on_launch_report=reports.append)
    assert pid not in parents and reports[0].warm_ranks() == []
    assert mentions_fork_unsafe(cloudpickle.dumps((tensorflow_fn, (), {}))) == "tensorflow"
    assert mentions_fork_unsafe(cloudpickle.dumps((numpy_and_user_fn, (), {}))) is None


def test_a_launch_with_another_environment_is_not_forked(warm):
    """The server imported under one environment; a launch whose ``env=`` differs gets fresh
    rank processes (and the stale server ends, so the next launch's tasks start a matching one).
    Runs last: it replaces this module's server."""
    directory, env = warm
    slot, info = current_server(directory)
    pid = int(info["pid"])
    reports: list[LaunchReport] = []
    results = kolo.spark.run(
        numpy_and_user_fn,
        num_proc=2,
        env={**env, "KOLO_WARM_TEST_VARIABLE": "1"},
        _on_launch_report=reports.append,
    )
    assert all(r[1] != pid for r in results) and reports[0].warm_ranks() == []
    deadline = time.monotonic() + 10
    while process_start_ticks(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process_start_ticks(pid) is None
    log = Path(slot.directory, slot.key + ".log").read_text()
    assert "the environment changed (KOLO_WARM_TEST_VARIABLE)" in log


def test_only_installed_modules_and_kolo_are_recorded_for_the_server(tmp_path):
    """What a fresh rank records for its executor's server: installed modules (numpy) and
    kolo's, in import order; never the user's modules from the working directory or from
    PYTHONPATH, even when they shadow nothing."""
    (tmp_path / "cwd_module.py").write_text("X = 1\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "path_module.py").write_text("Y = 2\n")
    code = (
        "import sys, json; sys.path.insert(0, ''); import numpy, cwd_module, path_module; "
        "import kolo.spark.task; from kolo._rank_process import third_party_modules; "
        "print(json.dumps(third_party_modules()))"
    )
    env = {**os.environ, "PYTHONPATH": with_path(elsewhere)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    names = json.loads(out.stdout.splitlines()[-1])
    assert "numpy" in names and "kolo.spark.task" in names
    assert names.index("numpy") < names.index("kolo.spark.task")
    assert not {"cwd_module", "path_module", "__main__", "kolo"} & set(names), names


def test_installed_modules_count_when_the_virtualenv_is_inside_the_working_directory():
    """A virtualenv inside the project (``project/.venv``, run from ``project/``, as CI does) is
    still an installed location: numpy from its site-packages is recorded although its path is
    under the working directory (before, every such module was taken for the user's code and the
    server pre-imported nothing but kolo)."""
    project = Path(sys.prefix).resolve().parent
    import numpy

    numpy_file = Path(numpy.__file__).resolve()
    assert numpy_file.is_relative_to(project), "numpy must be installed under sys.prefix"
    code = (
        "import json, numpy, kolo.spark.task; from kolo._rank_process import third_party_modules; "
        "print(json.dumps(third_party_modules()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=project, capture_output=True, text=True, check=True
    )
    names = json.loads(out.stdout.splitlines()[-1])
    assert "numpy" in names and "kolo.spark.task" in names, names


def test_stale_keys_are_swept_but_not_a_running_servers(tmp_path):
    """A key nobody holds and nobody touched for a day loses its files; a key whose lock is
    held (a running server) keeps them however old."""
    import fcntl

    directory = tmp_path / "warm"
    directory.mkdir(mode=0o700)
    old = time.time() - STALE_KEY_S - 60
    for key in ("a" * 24, "b" * 24):
        for suffix in (".lock", ".log", ".modules.json"):
            path = directory / (key + suffix)
            path.write_text("")
            os.utime(path, (old, old))
    held = os.open(directory / ("b" * 24 + ".lock"), os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        sweep_stale_keys(str(directory))
    finally:
        os.close(held)
    assert sorted(p.name for p in directory.iterdir()) == [
        "b" * 24 + suffix for suffix in (".lock", ".log", ".modules.json")
    ]
